"""What the head takes at submit: a script and environment one launch message can carry
(``launch_refusal``), and how many jobs it holds: ``[head] max_jobs`` over everyone, and ``max_submit_jobs``
per user on a QOS (``[qos.NAME]``) and on an account (``[accounts.NAME]``), as Slurm's
MaxJobCount, QOS MaxSubmitJobsPerUser and association MaxSubmitJobs; a job moved to another
QOS or account by its owner (``scontrol update``) is held to that one's caps.

A job counts from its submission until it ends: pending, held, running or completing; each
task of an array is one job.  A submission that would pass a cap is refused whole, with
Slurm's reason name, never queued in part.  ``SubmitCaps`` counts once for a whole group
commit (under the head's lock) and then admits its submissions one by one, so two
submissions in one commit cannot both take the last place.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from ..bus.envelope import MAX_PAYLOAD

if TYPE_CHECKING:
    from ..config import Config
    from .store import JobRecord

# Of one bus message (MAX_PAYLOAD, 1 MiB), what a job's script and environment may take,
# encoded as the envelope encodes them (JSON, non-ASCII escaped): the rest of the launch
# (paths, limits, a gang rank's variables) and the envelope's own fields take a few KiB,
# and an encrypted body travels as base64, a third larger.
LAUNCH_ROOM = MAX_PAYLOAD * 5 // 8
_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)


def launch_refusal(script: str, env: "dict[str, str]") -> str | None:
    """None when ``script`` and ``env`` fit in one launch message; else the one-line refusal."""
    if len(script) + sum(len(k) + len(v) for k, v in env.items()) <= LAUNCH_ROOM // 12:
        return None   # fits even if every character took two \uXXXX escapes: no need to encode
    size = len(_ASCII.encode(script)) + len(_ASCII.encode(env))
    if size <= LAUNCH_ROOM:
        return None
    return (f"Batch job submission failed: the script and its environment take {_kib(size)} KiB as sent to the "
            f"node, more than one launch message carries ({_kib(LAUNCH_ROOM)} KiB); keep large data in files "
            "the job reads, and export only the variables it needs (--export=NONE,VAR)")


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f}"


POLICY = "Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"


class SubmitCaps:
    def __init__(self, active: "dict[int, JobRecord]", cfg: "Config") -> None:
        self.max_jobs = cfg.head.max_jobs
        self.total = len(active)
        sched = cfg.sched
        self.qos_caps = {n: q.max_submit_jobs for n, q in sched.qos.items() if q.max_submit_jobs is not None}
        self.account_caps = {n: a.max_submit_jobs for n, a in sched.accounts.items()
                             if a.max_submit_jobs is not None}
        self.by_qos: Counter = Counter()
        self.by_account: Counter = Counter()
        if self.qos_caps or self.account_caps:   # a walk over the queue only where a cap needs it
            jobs: Iterable[JobRecord] = active.values()
            for j in jobs:
                if j.qos in self.qos_caps:
                    self.by_qos[j.uid, j.qos] += 1
                if j.account in self.account_caps:
                    self.by_account[j.uid, j.account] += 1

    def admit(self, jobs: "list[JobRecord]") -> str | None:
        """Count ``jobs`` (one submission, all of one user, QOS and account) in; or the
        one-line refusal, counting nothing."""
        n = len(jobs)
        first = jobs[0]
        if self.total + n > self.max_jobs:
            return (f"Batch job submission failed: Slurm temporarily unable to accept job: the cluster holds "
                    f"{self.total} jobs and takes at most {self.max_jobs} ([head] max_jobs); try again when "
                    "some have ended")
        qos_cap = self.qos_caps.get(first.qos)
        key = (first.uid, first.qos)
        if qos_cap is not None and self.by_qos[key] + n > qos_cap:
            return (f"{POLICY}: QOSMaxSubmitJobPerUserLimit: QOS {first.qos} allows {qos_cap} jobs per user and "
                    f"{first.user} has {self.by_qos[key]}" + (f"; this submission adds {n}" if n > 1 else ""))
        account_cap = self.account_caps.get(first.account)
        akey = (first.uid, first.account)
        if account_cap is not None and self.by_account[akey] + n > account_cap:
            return (f"{POLICY}: AssocMaxSubmitJobLimit: account {first.account} allows {account_cap} jobs per "
                    f"user and {first.user} has {self.by_account[akey]}" + (f"; this submission adds {n}" if n > 1 else ""))
        self.total += n
        if qos_cap is not None:
            self.by_qos[key] += n
        if account_cap is not None:
            self.by_account[akey] += n
        return None

    def move(self, job: "JobRecord", qos: str, account: str) -> str | None:
        """Count an existing ``job`` under a new ``qos`` and ``account`` (scontrol update):
        the same caps as a submission, for where it goes; or the refusal, counting nothing."""
        moved = replace(job, qos=qos, account=account)
        old_q, old_a = (job.uid, job.qos), (job.uid, job.account)
        was_q, was_a = self.by_qos[old_q], self.by_account[old_a]
        self.total -= 1
        if job.qos in self.qos_caps:
            self.by_qos[old_q] -= 1
        if job.account in self.account_caps:
            self.by_account[old_a] -= 1
        refusal = self.admit([moved])
        if refusal is not None:
            self.total += 1
            self.by_qos[old_q], self.by_account[old_a] = was_q, was_a
            return refusal.replace("Batch job submission failed: ", "", 1)
        return None
