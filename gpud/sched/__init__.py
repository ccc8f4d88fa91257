"""The pure scheduling core: ``schedule(snapshot, now) -> Plan``; see core.py."""

from .admission import Resolved, refusal, resolve_job
from .config import SchedConfig, SchedConfigError, sched_config_from_dict
from .core import schedule
from .plan import Plan, Preemption, Start
from .priority import ShareRow, fairshare_table
from .snapshot import GpuView, NodeView, PendingJob, RunningJob, Snapshot
from .usage import accrue, charge, decay

__all__ = [
    "GpuView", "NodeView", "PendingJob", "Plan", "Preemption", "Resolved", "RunningJob",
    "SchedConfig", "SchedConfigError", "ShareRow", "Snapshot", "Start", "accrue", "charge",
    "decay", "fairshare_table", "refusal", "resolve_job", "sched_config_from_dict", "schedule",
]
