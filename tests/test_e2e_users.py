"""Jobs run as their submitters; only owners and root may cancel (real users, real daemons)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.cluster import Cluster, wait_for
from tests.mqtt_broker import mosquitto  # noqa: F401  (fixture)
from tests.users import gpuctl_as, needs_root, temp_users

pytestmark = [pytest.mark.slow, needs_root]


@pytest.fixture
def world_dir():
    # pytest's tmp_path is private to root; users need to reach the socket and their work dirs.
    d = tempfile.mkdtemp(prefix="gpud-users-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_jobs_run_as_submitter_and_only_owner_or_root_cancels(world_dir, mosquitto):  # noqa: F811
    with temp_users(2) as (alice, bob), Cluster(os.path.join(world_dir, "c"), mosquitto.url) as c:
        c.start_head()
        c.start_worker("w1", "4xH100-80GB")
        ids = {}
        for u in (alice, bob):
            home = os.path.join(world_dir, u.name)
            os.mkdir(home)
            os.chown(home, u.uid, u.gid)
            rc, out, err = gpuctl_as(u, ["sbatch", "--parsable", "--gpus", "1", "--wrap",
                                         "id -u; id -g; id -G; sleep 30"], c.socket, cwd=home)
            assert rc == 0, err
            ids[u.name] = int(out.strip())
        for u in (alice, bob):
            job = c.wait_job_state(ids[u.name], "RUNNING")
            assert job["user"] == u.name and job["uid"] == u.uid
            out = os.path.join(world_dir, u.name, f"gpud-{ids[u.name]}.out")
            wait_for(lambda: os.path.exists(out) and len(open(out).read().split("\n")) >= 3, 30,
                     f"{u.name}'s job output")
            st = os.stat(out)
            assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
            uid, gid, groups = open(out).read().split("\n")[:3]
            assert int(uid) == u.uid and int(gid) == u.gid
            assert sorted(int(g) for g in groups.split()) == sorted(u.groups)

        # bob may not cancel alice's job; the refusal is one line and exit 1
        rc, out, err = gpuctl_as(bob, ["scancel", str(ids[alice.name])], c.socket)
        assert rc == 1 and "denied" in err.lower() and len(err.strip().splitlines()) == 1
        assert c.job(ids[alice.name])["state"] == "RUNNING"
        # claiming to be someone else in the request changes nothing: identity is SO_PEERCRED
        rc, out, err = gpuctl_as(bob, ["scancel", "-u", alice.name], c.socket)
        assert c.job(ids[alice.name])["state"] == "RUNNING"
        # the owner may
        rc, out, err = gpuctl_as(bob, ["scancel", str(ids[bob.name])], c.socket)
        assert rc == 0, err
        assert c.wait_job_state(ids[bob.name], "CANCELLED")["state"] == "CANCELLED"
        # root may cancel anyone's
        c.gpuctl("scancel", str(ids[alice.name]))
        assert c.wait_job_state(ids[alice.name], "CANCELLED")["state"] == "CANCELLED"
