"""``scontrol show job`` as Slurm's prints it, field for field, with scontrol(1) and Slurm's
job record as the oracle.

scontrol(1) (show job): NumCPUs and TRES count the whole allocation ("TRES=cpu=32,mem=64G,
node=2,billing=32,gres/gpu=8" for two nodes of 16 CPUs and 4 GPUs), MinCPUsNode and
MinMemoryNode are per node; ReqNodeList and ExcNodeList are sbatch's --nodelist and
--exclude, Features its --constraint, and OverSubscribe is NO for an --exclusive job and OK
otherwise.
"""

from __future__ import annotations

from gpuctl.commands.scontrol import job_record
from tests.slurm_head import HeadKit


def fields(record: list[str]) -> dict[str, str]:
    out = {}
    for word in " ".join(record).split():
        key, eq, value = word.partition("=")
        if eq:
            out[key] = value
    return out


async def test_a_multi_node_job_shows_its_totals_and_its_node_request(tmp_path):
    async with HeadKit(tmp_path) as kit:
        for name in ("n1", "n2", "n3"):
            kit.add_node(name, gpus=4, cpus=64)
        job = await kit.start_gang(nodes=2, gpus=8, cpus=16, mem_mb=32768, exclude=["n3"], exclusive=True)
        [shown] = (await kit.call("show", kind="job", job_ids=[job.job_id]))["jobs"]
        f = fields(job_record(shown))
        assert (f["NumNodes"], f["NumCPUs"], f["NumTasks"], f["CPUs/Task"]) == ("2", "32", "2", "16")
        assert f["TRES"] == "cpu=32,mem=64G,node=2,billing=8,gres/gpu=8"
        assert (f["MinCPUsNode"], f["MinMemoryNode"], f["TresPerNode"]) == ("16", "32G", "gres:gpu:4")
        assert (f["ReqNodeList"], f["ExcNodeList"], f["OverSubscribe"]) == ("(null)", "n3", "NO")
        assert (f["NodeList"], f["BatchHost"]) == ("n[1-2]", "n1")


async def test_a_single_node_job_shows_its_features_and_requested_nodes(tmp_path):
    async with HeadKit(tmp_path) as kit:
        kit.add_node("n1", gpus=4)
        kit.label_nodes(features="a100,ib")
        a = await kit.submit(gpus=1, cpus=4, nodelist=["n1"], constraint="a100&ib")
        [shown] = (await kit.call("show", kind="job", job_ids=[a]))["jobs"]
        f = fields(job_record(shown))
        assert (f["ReqNodeList"], f["ExcNodeList"], f["Features"], f["OverSubscribe"]) == ("n1", "(null)", "a100&ib", "OK")
        assert (f["NumCPUs"], f["TRES"].split(",")[0]) == ("4", "cpu=4")
