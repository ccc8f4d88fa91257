"""``gpuctl top``: the view of a known cluster state, compared with a snapshot; the verb on a
pipe (plain text once) and on a terminal (live refreshes)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from gpuctl.commands.top import plain, render
from tests.cluster import env_for_children
from tests.fake_head import FakeHead, node

SNAPSHOT = Path(__file__).parent / "snapshots" / "top.txt"
NOW = time.mktime((2026, 11, 29, 14, 20, 5, 0, 0, -1))   # local time, as top prints it


def gpu(index: int, util, mem, power, temp, job_ids=(), users=(), model="H100-80GB", memory=81920, slices=()):
    return {"index": index, "uuid": f"GPU-{index}", "model": model, "memory_mb": memory, "job_ids": list(job_ids),
            "users": list(users), "util": util, "mem_used_mb": mem, "power_w": power, "temp_c": temp,
            "slices": list(slices)}


def state() -> dict:
    """Two nodes: gpu01 runs a busy job on two GPUs and an idle one on one; gpu02 has MIG slices
    on one A100 and a GPU that has not been sampled; gpu10 is down."""
    gpu01 = node("gpu01", gpus=0, state="MIXED")
    gpu01["gpus"] = [gpu(0, 93.0, 61440, 655.0, 74.0, [42], ["alice"]),
                     gpu(1, 88.5, 60000, 640.0, 72.0, [42], ["alice"]),
                     gpu(2, 0.0, 300, 71.0, 31.0, [43], ["bob"]),
                     gpu(3, 0.0, 0, 70.0, 30.0)]
    gpu02 = node("gpu02", gpus=0, state="MIXED")
    gpu02["gpus"] = [gpu(0, None, 12000, 180.0, 45.0, [44], ["carol"], model="A100-80GB",
                         slices=[{"uuid": "MIG-5f2c0a51-aaaa-bbbb", "mem_used_mb": 9216},
                                 {"uuid": "MIG-77e1c0de-cccc-dddd", "mem_used_mb": 2048}]),
                     gpu(1, None, None, None, None, model="A100-80GB")]
    gpu10 = node("gpu10", gpus=0, state="DOWN")
    return {
        "now": NOW, "cluster": "prod", "nodes": [gpu10, gpu02, gpu01],
        "queue": {"gpu": {"pending": 5, "running": 2, "completing": 0, "pending_gpus": 12},
                  "debug": {"pending": 0, "running": 1, "completing": 0, "pending_gpus": 0}},
        "jobs": [
            {"job_id": 42, "user": "alice", "account": "physics", "partition": "gpu", "name": "train-llm",
             "node": "gpu01", "gpus": 2, "state": "RUNNING", "reason": None, "start_time": NOW - 3725,
             "gpu_util_mean": 90.7},
            {"job_id": 43, "user": "bob", "account": "physics", "partition": "gpu", "name": "notebook",
             "node": "gpu01", "gpus": 1, "state": "RUNNING", "reason": "GpuIdle", "start_time": NOW - 7300,
             "gpu_util_mean": 0.4},
            {"job_id": 44, "user": "carol", "account": "vision", "partition": "debug", "name": "eval",
             "node": "gpu02", "gpus": 1, "state": "RUNNING", "reason": None, "start_time": NOW - 65,
             "gpu_util_mean": None},
        ],
    }


def test_top_matches_its_snapshot():
    got = plain(state(), width=100)
    if os.environ.get("GPUD_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(got + "\n")
    assert got + "\n" == SNAPSHOT.read_text()


def test_a_terminal_gets_coloured_bars():
    console = Console(width=100, record=True, force_terminal=True, color_system="standard", file=open(os.devnull, "w"))
    console.print(render(state(), ascii_only=False))
    text = console.export_text(styles=True)
    assert "\u2588" * 9 in text and "\x1b[" in text


def test_an_empty_cluster():
    out = plain({"now": NOW, "cluster": "c", "nodes": [], "queue": {}, "jobs": []}, width=80)
    assert out.splitlines()[0].endswith("0 nodes, 0 GPUs, 0 allocated, 0 busy")
    assert "Queue: empty" in out


def test_gpuctl_top_on_a_pipe_prints_the_snapshot_once():
    with FakeHead() as head:
        head.reply("telemetry", state())
        env = dict(env_for_children(), COLUMNS="100")
        r = subprocess.run([sys.executable, "-m", "gpuctl.main", "--socket", head.path, "top"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout == SNAPSHOT.read_text()
        assert head.ops() == ["telemetry"]


def on_a_terminal(head: FakeHead, *args: str) -> tuple[int, bytes]:
    """Run ``gpuctl top ARGS`` with a pseudo-terminal as its stdout; (exit status, output)."""
    main, sub = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpuctl.main", "--socket", head.path, "top", *args],
                             env=env_for_children(), stdin=sub, stdout=sub, stderr=sub)
        os.close(sub)
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:   # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        return p.wait(60), out
    finally:
        os.close(main)


def test_gpuctl_top_on_a_terminal_refreshes_until_told_to_stop():
    with FakeHead() as head:
        head.reply("telemetry", state())
        code, out = on_a_terminal(head, "-n", "3", "-d", "0.2")
        assert code == 0
        assert head.ops() == ["telemetry"] * 3
        assert b"cluster prod at " in out and "\u2588".encode() in out


def test_gpuctl_top_keeps_the_last_view_while_the_head_does_not_answer():
    with FakeHead() as head:
        answers = [state()]
        head.handle("telemetry", lambda args, uid: answers.pop() if answers else b"")   # then hang up
        code, out = on_a_terminal(head, "-n", "2", "-d", "0.2")
        assert code == 0
        assert b"no answer from the head" in out and b"cluster prod at " in out


def test_q_quits_the_live_view():
    """top(1)'s q: the view ends at once, however long the delay."""
    with FakeHead() as head:
        head.reply("telemetry", state())
        main, sub = pty.openpty()
        try:
            p = subprocess.Popen([sys.executable, "-m", "gpuctl.main", "--socket", head.path, "top", "-d", "3600"],
                                 env=env_for_children(), stdin=sub, stdout=sub, stderr=sub)
            os.close(sub)
            out = b""
            while b"cluster prod at " not in out:
                out += os.read(main, 65536)
            os.write(main, b"q")
            assert p.wait(60) == 0
            assert head.ops() == ["telemetry"]
        finally:
            os.close(main)


def many_nodes(n: int, busy: int) -> dict:
    s = state()
    nodes = []
    for i in range(1, n + 1):
        nd = node(f"n{i:03d}", gpus=0, state="MIXED" if i <= busy else "IDLE")
        nd["gpus"] = [gpu(k, 90.0 if i <= busy else 0.0, 100, 300.0, 50.0, [100 + i] if i <= busy else [],
                          ["alice"] if i <= busy else []) for k in range(8)]
        nodes.append(nd)
    s["nodes"] = nodes
    s["jobs"] = [dict(s["jobs"][0], job_id=100 + i, display_id=f"100_{i}") for i in range(1, busy + 1)]
    return s


def lines(state_: dict, width: int, height: int, scroll: int = 0) -> list[str]:
    console = Console(width=width, height=height, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(render(state_, width=width, height=height, scroll=scroll))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_idle_nodes_fold_and_the_queue_stays_in_view():
    out = lines(many_nodes(100, busy=2), width=100, height=40)
    assert len(out) <= 40
    assert "n[003-100]  idle" in "\n".join(out) and "784 GPUs free" in "\n".join(out)
    assert any(line.startswith("Queue:") for line in out)
    assert any(line.strip().startswith("100_1 ") for line in out)      # array tasks as squeue shows them
    assert "100_2 (alice)" in "\n".join(out)                           # and as the GPUs' holders


def test_busy_nodes_scroll_instead_of_pushing_the_queue_off():
    s = many_nodes(30, busy=30)
    top, later = lines(s, width=100, height=30), lines(s, width=100, height=30, scroll=40)
    assert len(top) <= 30 and len(later) <= 30
    assert any(line.startswith("Queue:") for line in top) and any(line.startswith("Queue:") for line in later)
    assert any("GPU rows 1-" in line for line in top) and any(line.startswith("n001") for line in top)
    assert not any(line.startswith("n001") for line in later) and any(line.startswith("n006") for line in later)


def test_utilization_is_the_last_column_cut():
    narrow = plain(state(), width=50).splitlines()
    assert "[#########.]  93%" in "\n".join(narrow)
    assert all(h not in narrow[2] for h in ("TEMP", "POWER", "MODEL")) and "UTIL" in narrow[2]


def test_sinfo_gpus_shows_array_tasks_as_squeue_does():
    from gpuctl.format import sinfo_gpus_table

    g = dict(gpu(0, 50.0, 1, 1.0, 1.0, [12]), holders=[{"job_id": 12, "display_id": "11_1", "user": "alice"}])
    out = sinfo_gpus_table([dict(node("n1", gpus=0), gpus=[g])])
    assert "11_1(alice)" in out
