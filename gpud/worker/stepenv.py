"""An srun task's environment: the allocation's, plus the task's place in the step under
gpud's names, the ones torchrun and ``torch.distributed`` read, and Slurm's when the job
has them.  See gpud.worker.steps."""

from __future__ import annotations

__all__ = ["task_env"]


def task_env(base: dict[str, str], *, rank: int, local: int, per_node: int, node_rank: int, nnodes: int,
             step: int, master_addr: str, master_port: int, nodelist: str) -> dict[str, str]:
    """One task's environment: ``base`` plus its place in the step, under gpud's names,
    the ones torchrun and torch.distributed read, and Slurm's when the job has them."""
    world = per_node * nnodes
    env = dict(base)
    env.update({
        "GPUD_PROCID": str(rank), "GPUD_LOCALID": str(local), "GPUD_NTASKS": str(world),
        "GPUD_NTASKS_PER_NODE": str(per_node), "GPUD_NODEID": str(node_rank), "GPUD_NNODES": str(nnodes),
        "GPUD_STEP_ID": str(step), "GPUD_JOB_NODELIST": nodelist,
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(per_node), "NODE_RANK": str(node_rank), "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
    })
    if "SLURM_JOB_ID" in base:
        env.update({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NTASKS": str(world),
                    "SLURM_NODEID": str(node_rank), "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step)})
    return env
