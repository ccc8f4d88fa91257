"""GPU sharing through the real daemons: a sim worker with a dynamic MIG A100 and an MPS H100,
Mosquitto, SQLite, and jobs run as real users."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.users import gpuctl_as, needs_root, temp_users

pytestmark = [pytest.mark.slow, needs_root]

SHARED = """gpu_modes = { "0" = "mig:dynamic", "1" = "mps:thread_percentage=25" }
[scheduler]
mig_min_interval = "0s"
"""


@pytest.fixture
def world_dir():
    d = tempfile.mkdtemp(prefix="gpud-sharing-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    if not os.environ.get("KEEP_WORLD"):
        shutil.rmtree(d, ignore_errors=True)


def _held(release: str) -> str:
    """A job that prints its GPU environment, then waits for ``release`` to appear."""
    return (f'env | grep -E "^CUDA_" | sort; while [ ! -e {release} ]; do sleep 0.1; done')


def _running(c: Cluster, ids: list[int]) -> bool:
    jobs = c.jobs(all=False)
    return all(jobs.get(j, {}).get("state") == "RUNNING" for j in ids)


def _output(path: str, lines: int = 1) -> str:
    wait_for(lambda: os.path.exists(path) and open(path).read().count("\n") >= lines, 30, f"output {path}")
    return open(path).read()


def test_dynamic_mig_and_mps_through_the_daemons(world_dir, mosquitto):  # noqa: F811
    with temp_users(2) as (alice, bob), Cluster(os.path.join(world_dir, "c"), mosquitto.url,
                                                extra_toml=SHARED) as c:
        c.start_head()
        c.start_worker("w1", "1xA100-80GB,1xH100-80GB")
        homes = {}
        for u in (alice, bob):
            homes[u.name] = os.path.join(world_dir, u.name)
            os.mkdir(homes[u.name])
            os.chown(homes[u.name], u.uid, u.gid)

        def sbatch(u, *args: str) -> int:
            rc, out, err = gpuctl_as(u, ["sbatch", "--parsable", *args], c.socket, cwd=homes[u.name])
            assert rc == 0, err
            return int(out.strip())

        # seven 1g.10gb slices cut on the idle A100, all seven jobs at once
        small_go = os.path.join(world_dir, "small-go")
        small = [sbatch(alice, "--gpus", "1g.10gb", "--wrap", _held(small_go)) for _ in range(7)]
        wait_for(lambda: _running(c, small), 60, "seven 1g.10gb jobs running at once")
        uuids = set()
        for j in small:
            out = _output(os.path.join(homes[alice.name], f"gpud-{j}.out"))
            line = next(x for x in out.splitlines() if x.startswith("CUDA_VISIBLE_DEVICES="))
            uuids.add(line.split("=", 1)[1])
        assert len(uuids) == 7 and all(u.startswith("MIG-") for u in uuids)
        table = c.gpuctl("sinfo", "-G").stdout
        assert "mig dynamic" in table and "7/7 slices" in table

        # a 7g.80gb waits for them, then gets the GPU re-laid
        big = sbatch(bob, "--gpus", "7g.80gb", "--wrap", 'echo "$CUDA_VISIBLE_DEVICES"')
        wait_for(lambda: (c.jobs(all=False).get(big) or {}).get("reason") in ("Resources", "Priority"), 30,
                 "the 7g job to wait")
        open(small_go, "w").close()
        c.wait_job_state(big, "COMPLETED", 60)
        out = _output(os.path.join(homes[bob.name], f"gpud-{big}.out"))
        assert out.strip().startswith("MIG-") and out.strip() not in uuids
        assert all(c.job(j)["state"] == "COMPLETED" for j in small)

        # MPS: four 20G shares of alice's run together with the MPS environment; a fifth and
        # bob's wait; bob's starts only once alice's jobs have all left
        mps_go = os.path.join(world_dir, "mps-go")
        on_h100 = ("--gpu-type", "H100-80GB", "--gpu-mem", "20G")    # not a slice of the A100
        shares = [sbatch(alice, *on_h100, "--wrap", _held(mps_go)) for _ in range(5)]
        wait_for(lambda: _running(c, shares[:4]), 60, "four MPS shares running")
        # bob's only now: with less usage he ranks above alice, and a waiting user's claim on
        # an MPS GPU holds back the other user's next shares, so submitted with hers it could
        # keep her fourth one waiting (by design: a stream of hers cannot starve him)
        other = sbatch(bob, *on_h100, "--wrap", "true")
        for j in shares[:4]:
            env = _output(os.path.join(homes[alice.name], f"gpud-{j}.out"), 3)
            assert "CUDA_MPS_PIPE_DIRECTORY=" in env
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env
        waiting = c.jobs(all=False)
        assert waiting[shares[4]]["state"] == "PENDING" and waiting[other]["state"] == "PENDING"
        open(mps_go, "w").close()
        c.wait_job_state(other, "COMPLETED", 60)
        for j in shares:
            mine = c.wait_job_state(j, "COMPLETED", 60)
            theirs = c.job(other)
            assert mine["end_time"] <= theirs["start_time"] or mine["start_time"] >= theirs["end_time"], \
                "bob's job shared an MPS server with alice's"
