"""The pure scheduling core: ``schedule(snapshot, now) -> Plan``; see core.py."""

from .admission import Resolved, refusal, resolve_job
from .config import SchedConfig, SchedConfigError, sched_config_from_dict
from .core import schedule
from .plan import Plan, Preemption, Relayout, Start
from .priority import ShareRow, fairshare_table
from .snapshot import Device, GpuView, NodeView, PendingJob, RunningJob, SliceView, Snapshot
from .usage import accrue, charge, decay

__all__ = [
    "Device", "GpuView", "NodeView", "PendingJob", "Plan", "Preemption", "Relayout", "Resolved", "RunningJob",
    "SchedConfig", "SchedConfigError", "ShareRow", "SliceView", "Snapshot", "Start", "accrue", "charge",
    "decay", "fairshare_table", "refusal", "resolve_job", "sched_config_from_dict", "schedule",
]
