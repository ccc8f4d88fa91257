"""Admission at submit time: fill in defaults, and refuse what can never run.

"Not now" is the scheduler's business (a pending reason); "never" is refused here, with a
message that says what to change.  The rules themselves are pure and live in
``gpud.sched.admission`` so that the simulator applies the same ones.
"""

from __future__ import annotations

from ..model import JobSpec, NodeInfo
from ..sched.admission import Resolved, refusal, resolve_job
from ..sched.config import SchedConfig

__all__ = ["Refused", "Resolved", "resolve"]


class Refused(Exception):
    """A request that can never run; the message is for the user."""


def resolve(spec: JobSpec, user: str, cfg: SchedConfig, nodes: list[NodeInfo]) -> Resolved:
    resolved = resolve_job(spec, user, cfg, nodes)
    why = refusal(spec, resolved, user, cfg, nodes)
    if why is not None:
        raise Refused(why)
    return resolved
