"""A sender's epoch grows from one run to the next, even when its clock went back between."""

import os
import stat

from gpud.bus import epoch


def fresh_process(monkeypatch):
    monkeypatch.setattr(epoch, "_epoch", None)


def test_the_epoch_is_chosen_once_per_process(monkeypatch):
    fresh_process(monkeypatch)
    first = epoch.process_epoch(clock_ns=lambda: 5)
    assert epoch.process_epoch(clock_ns=lambda: 99) == first == 5


def test_a_clock_stepped_back_between_runs_still_gives_a_newer_epoch(monkeypatch, tmp_path):
    path = str(tmp_path / "bus-epoch-head")
    fresh_process(monkeypatch)
    run1 = epoch.process_epoch(path, clock_ns=lambda: 10_000_000_000_000)
    fresh_process(monkeypatch)
    hour = 3600 * 10**9
    run2 = epoch.process_epoch(path, clock_ns=lambda: 10_000_000_000_000 - hour)   # clock went back 1 h
    assert run2 > run1
    fresh_process(monkeypatch)
    assert epoch.process_epoch(path, clock_ns=lambda: 10_000_000_000_000 + hour) == 10_000_000_000_000 + hour
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["bus-epoch-head"]


def test_an_unwritable_or_garbled_file_falls_back_to_the_clock(monkeypatch, tmp_path, caplog):
    bad = tmp_path / "garbled"
    bad.write_text("not a number\n")
    fresh_process(monkeypatch)
    assert epoch.process_epoch(str(bad), clock_ns=lambda: 7) == 7
    fresh_process(monkeypatch)
    assert epoch.process_epoch(str(tmp_path / "missing-dir" / "f"), clock_ns=lambda: 8) == 8
    assert "malformed epoch file" in caplog.text and "cannot record the epoch" in caplog.text
