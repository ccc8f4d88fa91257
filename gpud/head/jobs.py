"""Job lifecycle rules the head applies to events: how a worker's report ends a job.

Pure functions over ``JobRecord``s; the daemon turns their answers into transactions.
"""

from __future__ import annotations

from ..model import JobState, StopReason
from .store import JobRecord

REQUEUE_RESET = dict(node=None, gpu_indices=(), gpu_uuids=(), start_time=None, end_time=None,
                     launched_at=None, stop_reason=None, stop_time=None, exit_code=None,
                     signal=None, borrowed=False, devices=(), parts=())


LEASE_EXPIRED = "lease_expired"   # a worker's end reason: it could not renew its lease


def final_state(job: JobRecord, reason: str, exit_code: int | None, signal: int | None) -> JobState:
    """The state a job ends in when its worker reports ``reason`` for the current attempt.

    A stop the head asked for (cancel, preemption) decides over what the process did: a
    job cancelled while it exited 0 on its own is still CANCELLED, as in Slurm.
    """
    stop = StopReason.of(job.stop_reason)
    if stop is not None and stop.kind == "preempted":
        return JobState.PENDING if stop is StopReason.PREEMPTED_REQUEUE and job.spec.requeue else JobState.PREEMPTED
    if stop is StopReason.CANCELLED:
        return JobState.CANCELLED
    if stop is StopReason.RELEASED:   # an interactive allocation given back (head/interactive.py)
        return JobState.COMPLETED
    if stop is StopReason.REQUEUE:   # scontrol requeue (head/ops_slurm.py)
        return JobState.PENDING
    if stop is not None and stop.kind == "idle":   # the partition's idle-GPU policy (head/telemetry.py)
        return JobState.PENDING if stop is StopReason.IDLE_REQUEUE and job.spec.requeue else JobState.CANCELLED
    if reason == LEASE_EXPIRED:   # the node lost its lease and killed the job itself
        return JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
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
