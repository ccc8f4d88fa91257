"""Job lifecycle rules the head applies to events: how a worker's report ends a job.

Pure functions over ``JobRecord``s; the daemon turns their answers into transactions.
"""

from __future__ import annotations

from ..model import JobState
from .store import JobRecord

REQUEUE_RESET = dict(node=None, gpu_indices=(), gpu_uuids=(), start_time=None, end_time=None,
                     launched_at=None, stop_reason=None, stop_time=None, exit_code=None,
                     signal=None, borrowed=False, devices=(), parts=())


def final_state(job: JobRecord, reason: str, exit_code: int | None, signal: int | None) -> JobState:
    """The state a job ends in when its worker reports ``reason`` for the current attempt.

    A stop the head asked for (cancel, preemption) decides over what the process did: a
    job cancelled while it exited 0 on its own is still CANCELLED, as in Slurm.
    """
    stop = job.stop_reason or ""
    if stop.startswith("preempted:"):
        return JobState.PENDING if stop == "preempted:requeue" and job.spec.requeue else JobState.PREEMPTED
    if stop == "cancelled":
        return JobState.CANCELLED
    if stop == "released":   # an interactive allocation given back (head/interactive.py)
        return JobState.COMPLETED
    if stop == "requeue":   # scontrol requeue (head/ops_slurm.py)
        return JobState.PENDING
    if stop.startswith("idle:"):   # the partition's idle-GPU policy (head/telemetry.py)
        return JobState.PENDING if stop == "idle:requeue" and job.spec.requeue else JobState.CANCELLED
    if reason == "timeout":
        return JobState.TIMEOUT
    if reason == "oom":
        return JobState.OUT_OF_MEMORY
    if reason == "cancelled":
        return JobState.CANCELLED
    if reason == "exited" and exit_code == 0 and not signal:
        return JobState.COMPLETED
    return JobState.FAILED


def requeue_changes(job: JobRecord) -> dict:
    """Column changes for a job going back to PENDING: same id, same submit time."""
    return dict(REQUEUE_RESET, requeue_count=job.requeue_count + 1, reason=None)


def may_modify(job_uid: int, caller_uid: int, caller_user: str, admins: frozenset[str], head_uid: int) -> bool:
    """Only the owner, root, the head's own user or a configured admin may change a job."""
    return caller_uid in (job_uid, 0, head_uid) or caller_user in admins
