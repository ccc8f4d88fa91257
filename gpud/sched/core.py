"""``schedule(snapshot, now) -> Plan``: the one scheduling decision procedure.

Theory of operation
-------------------
A pass is a pure function of the snapshot and ``now``: no I/O, no clock, no randomness, and
every ordering ends in a job id or node order, so the same input always gives the same plan.
It reads as numbered steps:

1. Build the working state: free capacity per node (placement.Cluster), when held
   resources come back (backfill.Timeline), quota and limit counters (quota.QuotaBook).
2. Compute every pending job's priority (priority.PriorityModel, Fair Tree fair-share).
3. Order the queue: priority, then submit time, then job id, except that a job waiting for
   what its preemptions free (``Snapshot.claims``) goes first, so that it gets it.  With
   quotas on, jobs that fit within their account's guarantee go first; jobs that would
   borrow are considered in a second round, in the same order, with what is left.
4. For each job, in order:
   a. not eligible (held, dependency, begin time): pass the head's reason through;
   b. can never run here as configured (unknown partition/QOS/account, over the
      partition's time limit, no node big enough): say why;
   c. limits (QOS GPUs per user, account gpu_limit): wait with the limit's name;
   d. place now, if that delays no reservation of a higher job;
   e. else, if resources already being freed (stopping jobs) suffice soon, wait for them;
   f. else preempt (QOS preemption or quota reclaim), within the caps; the job waits for
      its victims to exit and starts in a later pass;
   g. else reserve the earliest start (backfill), for the first ``backfill_depth`` jobs;
   h. and record why it waits: ``Resources`` for the first waiter of a partition,
      ``Priority`` behind it or when only a reservation kept it from starting.

   A job that asks for several nodes (a gang), names nodes or features, or wants its nodes
   exclusively takes steps a-c, then goes to ``gang.Gangs``: N nodes at once now (fewest
   switches, then racks, then binpack order), else a reservation on N nodes at the earliest
   time they are all free together.  A gang is never preempted and, like an exclusive job,
   does not preempt; a single-node job with node filters preempts on its candidates only.

   A fractional request (MIG slices, ``--gpu-mem``) takes steps a and b, then goes to
   ``slices.Slices`` or ``shares.Shares`` (over the pass's ``shared.SharedGpus``): a free
   slice or share now (never delaying a reservation), else a MIG re-layout
   (``Plan.relayouts``, reason ``MigReconfig``), else, within its quota, reclaim of
   borrowed slices or shares on one GPU, else a claim on the GPU where it starts earliest.
   It counts against limits and quotas by its fraction of a GPU.

Scale: placement searches indexed buckets of nodes by free GPUs; a request shape that failed
once in a pass is not searched again (resources only shrink during a pass); reservations are
capped at ``backfill_depth``; victim search runs only when some candidate exists and the rate
cap allows.  The per-job path of a whole-GPU single-node job (nearly every job of a big
queue) runs inline in ``consider_all`` with one verdict lookup per (shape, QOS, account);
fractional and gang jobs leave it for their own methods.  Answers that depend on one node
(does a start delay its reservations, its cheapest victim set) are remembered until that
node's timeline version changes.  Every shortcut must leave the plan exactly as it was:
tests/test_sched_fastpath.py holds them to the plain computation (those of fractional
requests, in slices.py and shares.py: tests/test_sched_sharing_fastpath.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Container

from .backfill import Timeline
from .gang import Gangs, Request, switch_limit
from .placement import Cluster
from .plan import Plan, Preemption, Start
from .preempt import Choice, Preemptor
from .priority import PriorityModel
from .quota import QuotaBook
from .shapes import Demand, ShapeIndex
from .shared import SharedGpus
from .shares import Shares
from .slices import Slices
from .gpustate import device_fraction
from .snapshot import Device, GpuView, Part, PendingJob, RunningJob, Snapshot

INF = float("inf")


def schedule(snap: Snapshot, now: float) -> Plan:
    """Decide what starts, what is preempted, and why everything else waits."""
    return _Pass(snap, now).run()


def claimants_first(queue: list[PendingJob], claims: tuple[tuple[int, int], ...],
                    pending: Container[int]) -> list[PendingJob]:
    """``queue`` with every pending job that preempted others (``claims``: victim, preemptor)
    moved to the front, in queue order, except that a claimant that is itself the victim of
    another claimant goes after that one.

    A preemption frees resources for the job that asked for it, but they come back passes
    later, when the victims have exited; in plain queue order the first job that fits then
    takes them, and that can be the requeued victim itself (its priority is its own, the
    preemption comes from its QOS), which is then preempted again, up to ``max_per_job``.
    ``pending``: the ids of the jobs in ``queue``."""
    victim_of = {v: b for v, b in claims if b in pending}
    if not victim_of:
        return queue
    claimants = set(victim_of.values())
    first = [j for j in queue if j.job_id in claimants]
    for _ in range(len(first)):   # a chain: a claimant goes just after the one that preempted it
        pos = {j.job_id: k for k, j in enumerate(first)}
        late = next((k for k, j in enumerate(first) if pos.get(victim_of.get(j.job_id), -1) > k), None)
        if late is None:
            break
        job = first.pop(late)
        first.insert(pos[victim_of[job.job_id]], job)   # its preemptor moved up one: just after it
    return first + [j for j in queue if j.job_id not in claimants]


class _NodeOk:
    """Whether a fractional job may start on node ``i`` now, taking whole GPUs ``gpus``
    (none for a slice or share): a member of its partition, up, not held exclusively, with
    its CPUs and memory free, and delaying no reservation there."""

    __slots__ = ("members", "c", "tl", "cpus", "mem", "end")

    def __init__(self, members: Container[int], c: Cluster, tl: Timeline, cpus: int, mem: int, end: float) -> None:
        self.members, self.c, self.tl, self.cpus, self.mem, self.end = members, c, tl, cpus, mem, end

    def __call__(self, i: int, gpus: tuple[int, ...]) -> bool:
        c, tl = self.c, self.tl
        return (i in self.members and c.up[i] and i not in c.exclusive and c.cpus[i] >= self.cpus
                and c.mem[i] >= self.mem and (i not in tl.reserved or tl.no_delay(i, gpus, self.cpus, self.mem, self.end)))


class _Pass:
    # -- step 1: working state --------------------------------------------------------------------
    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap, self.now, self.cfg = snap, now, snap.config
        self.plan = Plan()
        self.cluster = Cluster(snap.nodes, snap.running, self.cfg)
        self.timeline = Timeline(self.cluster, snap.running, now)
        self._views: dict[str, dict[int, GpuView]] | None = None
        self.book = QuotaBook(self.cfg, snap.running, self.share_of)
        self._shared: SharedGpus | None = None   # built for the first fractional request
        self._slices: Slices | None = None
        self._shares: Shares | None = None
        self._gangs: Gangs | None = None
        self._shapes: ShapeIndex | None = None   # built for the first search under placement "shapes"
        members = {(j.account, j.user) for j in snap.pending} | {(r.account, r.user) for r in snap.running}
        max_gpus = {p: self.cluster.max_gpus(p) for p in self.cfg.partitions}
        self.prio = PriorityModel(self.cfg, snap.usage, members, max_gpus, now)
        self._preemptor: Preemptor | None = None
        self.targets = {name: frozenset(q.preempt) for name, q in self.cfg.qos.items()}
        # False for a QOS whose jobs cannot preempt anything (more) in this pass
        self.may_preempt = {name: bool(t) or self.book.enabled for name, t in self.targets.items()}
        self.reasons = self.plan.reasons
        # Pruning caches, keyed by request shape.  Within a pass resources only shrink and
        # reservations only grow, so what failed once fails again.
        self.failed_shapes: set[tuple] = set()        # placements that cannot succeed this pass
        self.failed_preempts: set[tuple] = set()      # victim searches that found nothing
        self.misfits: dict[tuple, str | None] = {}
        # a plain job's (partition, size, time limit, QOS, account) -> (misfit verdict, request
        # shape, [placement failed for that shape]): one lookup per job instead of three; the
        # verdict becomes "Priority" once such jobs can only wait behind a higher one
        self.verdicts: dict[tuple, tuple[str | None, tuple, list[bool]]] = {}
        self.shape_failed: dict[tuple, list[bool]] = {}
        self.searches: dict[tuple, Callable[[], tuple[int | None, bool]]] = {}   # request shape -> search_for
        self.waiting: set[str] = set()                # partitions with a higher job waiting
        self.depth_left = self.cfg.backfill_depth if self.cfg.backfill else 0

    def run(self) -> Plan:
        # -- step 2: priorities
        plan = self.plan
        pending = self.snap.pending
        if len({j.job_id for j in pending}) != len(pending):   # a bad snapshot: first of each id wins
            pending = tuple({j.job_id: j for j in reversed(pending)}.values())[::-1]
        # -- step 3: the ordered queue (priority, submit time, job id), built alongside
        plan.factors, plan.priorities, queue = self.prio.for_jobs(pending)
        if self.snap.claims:
            queue = claimants_first(queue, self.snap.claims, plan.priorities)
        self.queue = queue
        # -- step 4, each job in order; with quotas on, borrowers come back for a second round
        borrowing = self.consider_all(queue, may_borrow=not self.book.enabled)
        if borrowing:
            self.consider_all(borrowing, may_borrow=True)
        return plan

    def shared(self) -> SharedGpus:
        if self._shared is None:     # the whole queue's slice demand, as the first fraction sees it
            self._shared = SharedGpus(self.snap, self.cluster, self.now)
            self._slices = Slices(self._shared, self.queue)
            self._shares = Shares(self._shared, self._slices)
        return self._shared

    def share_of(self, r: RunningJob) -> float:
        """The GPUs a running job on slices or shares counts: its fraction, as billed."""
        return self.fraction(r.node, r.devices) if any(d.kind != "gpu" for d in r.devices) else float(len(r.gpu_indices))

    def fraction(self, node: str, devices: tuple[Device, ...]) -> float:
        if self._views is None:
            self._views = {n.name: {g.index: g for g in n.gpus} for n in self.snap.nodes}
        views = self._views.get(node, {})
        return sum(device_fraction(d, views.get(d.index)) for d in devices)

    def shape_index(self) -> ShapeIndex:
        """Nodes grouped by state, scored by the fragmentation a start leaves (shapes.py)."""
        if self._shapes is None:
            mps = [g.memory_mb for n in self.snap.nodes for g in n.gpus if g.mode == "mps"]
            shared = self.shared().on_node if any(g.mode != "whole" for n in self.snap.nodes for g in n.gpus) else {}
            demand = Demand.of(self.snap.pending, self.snap.running, self.now, max(mps, default=1))
            self._shapes = ShapeIndex(self.cluster, shared, demand)
            self.cluster.watch = self._shapes.touch
        return self._shapes

    def consider_all(self, jobs: list[PendingJob], may_borrow: bool) -> list[PendingJob]:
        """Step 4 (a-h of the module's cycle) for each job, in order; the jobs that would
        borrow when it is not allowed.

        A whole-GPU single-node job (nearly every job of a big queue) is decided here inline,
        with the pass's state held in locals: this loop runs once per pending job, and most
        of its jobs only find their shape already failed.  Shared-GPU and multi-node jobs go
        to ``consider_shared`` and ``consider_gang``."""
        reasons, verdicts, waiting, searches = self.reasons, self.verdicts, self.waiting, self.searches
        book, may_preempt = self.book, self.may_preempt
        quota_on, limits_on, strict = book.enabled, book.any_limits, not self.cfg.backfill
        plain = not (quota_on or limits_on or strict)     # no step but d-g can hold a job back
        later: list[PendingJob] = []
        for job in jobs:
            key = job.plain_key     # None unless a whole-GPU single-node job, eligible now
            if key is None:
                # a. not eligible now
                if job.held or job.blocked_reason:
                    reasons[job.job_id] = job.blocked_reason or "Held"
                elif job.mig_profile is not None or job.gpu_mem_mb is not None:      # job.shared, inlined
                    self.consider_shared(job)
                elif not self.consider_gang(job, may_borrow):     # several nodes, node filters, exclusive
                    later.append(job)
                continue
            # b. cannot run as configured
            partition = job.partition
            verdict = verdicts.get(key)
            if verdict is None:             # not asked yet this pass
                verdict = verdicts[key] = self.verdict(job, key)
            refusal, shape, failed = verdict
            if refusal:                     # refused, or settled as the rest of a busy queue
                reasons[job.job_id] = refusal
                continue
            if plain and failed[0] and self.depth_left <= 0 and not may_preempt.get(job.qos, True):
                # the rest of a busy queue: its shape cannot start, reserve or preempt (steps
                # c-g change nothing), so only step h is left.  All of that only ever stays
                # so in a pass, so once a higher job waits in its partition every later job
                # with this key is settled: Priority, read with the verdict
                if partition in waiting:
                    reasons[job.job_id] = "Priority"
                    verdicts[key] = ("Priority", shape, failed)
                else:
                    reasons[job.job_id] = "Resources"
                    waiting.add(partition)
                continue
            # c. limits
            if limits_on:
                limit = book.limit_reason(job.qos, job.user, job.account, job.gpus)
                if limit:
                    reasons[job.job_id] = limit
                    continue
            within = not quota_on or book.within(job.account, job.gpus)
            if not within and not may_borrow:
                later.append(job)
                continue
            # d. place now
            blocked = False
            if strict and partition in waiting:
                blocked = True   # strict priority order without backfill
            elif not failed[0]:
                search = searches.get(shape)
                if search is None:
                    search = searches[shape] = self.search_for(shape)
                node, blocked = search()
                if node is not None:
                    self.start(job, node, borrowed=not within)
                    continue
                failed[0] = True
            # e-g. wait for stopping jobs, preempt, or reserve
            if self.depth_left > 0 or may_preempt.get(job.qos, True):
                self.wait(job, shape, within)
            # h. why
            if job.job_id not in reasons:
                reasons[job.job_id] = "Priority" if blocked or partition in waiting else "Resources"
            waiting.add(partition)
        return later

    # -- step 4: one job (the plain path is inline in consider_all) -------------------------------------
    def verdict(self, job: PendingJob, key: tuple) -> tuple[str | None, tuple, list[bool]]:
        shape = key[:6]
        failed = self.shape_failed.get(shape)
        if failed is None:
            failed = self.shape_failed[shape] = [False]
        return self.misfit(job), shape, failed

    def misfit(self, job: PendingJob) -> str | None:
        refusal = self.misconfigured(job)
        if refusal:
            return refusal
        verdict = self.cluster.feasibility(job.partition, job.gpus, job.cpus, job.mem_mb, job.gpu_type)
        if verdict == "never":
            return "BadConstraints"
        if verdict == "down":
            return "ReqNodeNotAvail"
        return None

    def misconfigured(self, job: PendingJob) -> str | None:
        cfg = self.cfg
        part = cfg.partitions.get(job.partition)
        if part is None:
            return "InvalidPartition"
        if job.qos not in cfg.qos:
            return "InvalidQOS"
        if job.account not in cfg.accounts:
            return "InvalidAccount"
        if part.max_time is not None and (job.time_limit is None or job.time_limit > part.max_time):
            return "PartitionTimeLimit"
        if job.gpus < 0 or job.cpus < 0 or job.mem_mb < 0:
            return "BadConstraints"
        return None

    def end_of(self, job: PendingJob) -> float:
        return INF if job.time_limit is None else self.now + job.time_limit

    def search_for(self, shape: tuple) -> Callable[[], tuple[int | None, bool]]:
        """The placement search for one request shape, built once: the shape fixes all it needs."""
        partition, gpus, cpus, mem, model, time_limit = shape
        c, tl = self.cluster, self.timeline
        end = INF if time_limit is None else self.now + time_limit

        def delays_reservation(i: int) -> bool:
            return not tl.no_delay(i, c.pick(i, gpus, model), cpus, mem, end)

        policy = self.cfg.placement_for(partition)
        if policy == "shapes":
            return self.shape_index().finder(c.members.get(partition, ()), gpus, cpus, mem, model, tl.reserved,
                                             delays_reservation)
        # vetoes remembered per node until it changes: a busy queue asks often
        return c.finder(partition, gpus, cpus, mem, model, self.cfg.placement_for(partition), tl.reserved,
                        delays_reservation, tl.versions)

    def start(self, job: PendingJob, i: int, borrowed: bool) -> None:
        c = self.cluster
        gpus = c.take(i, job.gpus, job.gpu_type, job.cpus, job.mem_mb)
        end = INF if job.time_limit is None else self.now + job.time_limit     # end_of, inlined
        self.timeline.add_start(i, gpus, job.cpus, job.mem_mb, end, job.job_id)
        if self.book.counting:
            self.book.on_start(job.account, job.qos, job.user, job.gpus)
        self.plan.starts.append(Start(job.job_id, c.nodes[i].name, gpus, job.cpus, job.mem_mb,
                                      borrowed=borrowed and job.gpus > 0))

    def consider_shared(self, job: PendingJob) -> None:
        """Steps b and d-h for a fractional request (see shared.py, slices.py, shares.py)."""
        key = ("shared", job.partition, job.mig_profile, job.gpu_mem_mb, job.gpus, job.cpus, job.mem_mb,
               job.gpu_type, job.time_limit, job.qos, job.account)
        refusal = self.misfits.get(key, "")
        if refusal == "":
            refusal = self.misfits[key] = self.misconfigured(job) or self.shared().misfit(job)
        if refusal:
            self.reasons[job.job_id] = refusal
            return
        c, tl = self.cluster, self.timeline
        end = INF if job.time_limit is None else self.now + job.time_limit     # end_of, inlined
        shared = self.shared()
        book = self.book
        if book.any_limits:      # its fraction counts, at least the least any GPU here would give
            limit = book.limit_reason(job.qos, job.user, job.account, shared.least_fraction(job))
            if limit:
                self.reasons[job.job_id] = limit
                return
        node_ok = _NodeOk(shared.members(job.partition), c, tl, job.cpus, job.mem_mb, end)
        scorer = self.shape_index() if self.cfg.placement_for(job.partition) == "shapes" else None
        if job.mig_profile:
            assert self._slices is not None
            d = self._slices.consider(job, end, node_ok, may_claim=self.depth_left > 0)
        else:
            assert self._shares is not None
            self._shares.scorer = scorer
            d = self._shares.consider(job, end, node_ok, may_claim=self.depth_left > 0)
        if d.relayouts:
            self.plan.relayouts.extend(d.relayouts)
        if d.node is not None:
            i = d.node
            c.allocate(i, d.gpu_indices, job.cpus, job.mem_mb)
            tl.add_start(i, d.gpu_indices, job.cpus, job.mem_mb, end, job.job_id)
            if book.counting:
                book.on_start(job.account, job.qos, job.user, self.fraction(c.nodes[i].name, d.devices))
            borrowed = book.enabled and not book.within(job.account, shared.least_fraction(job))
            self.plan.starts.append(Start(job.job_id, c.nodes[i].name, d.gpu_indices, job.cpus, job.mem_mb,
                                          borrowed=borrowed, devices=d.devices))
            return
        self.reasons[job.job_id] = d.reason or "Resources"
        if (book.enabled and not d.relayouts and (job.mig_profile is None or job.gpus <= 1)
                and book.within(job.account, shared.least_fraction(job)) and self.reclaim_fraction(job)):
            return                # f. quota reclaim: borrowed slices or shares make way
        if d.expected is not None and d.expected_node is not None:
            self.depth_left -= 1
            self.plan.expected_starts[job.job_id] = d.expected
            self.plan.reserved_nodes[job.job_id] = c.nodes[d.expected_node].name

    def reclaim_fraction(self, job: PendingJob) -> bool:
        """Step f for a within-quota fraction: preempt the fewest borrowed jobs of other pools
        on one GPU whose exit leaves the job its share (an MPS GPU) or slice (a MIG GPU)."""
        pre = self.preemptor()
        if not pre.fractional or pre.budget <= 0:
            return False
        c, shared, pool = self.cluster, self.shared(), self.book.pool(job.account)
        kind = "mig" if job.mig_profile else "mps"
        usable = shared.candidate_set(job, (kind,))
        want = job.gpu_mem_mb or 0
        best: tuple[tuple, int, tuple[RunningJob, ...]] | None = None
        for (i, gi), _ in sorted(pre.fractional.items()):
            g = next((h for h in shared.on_node.get(i, ()) if h.index == gi), None)
            if g is None or g not in usable or g.busy:
                continue

            def room(chosen: list[RunningJob], g=g, i=i) -> bool:
                if c.cpus[i] + sum(v.cpus for v in chosen) < job.cpus or \
                        c.mem[i] + sum(v.mem_mb for v in chosen) < job.mem_mb:
                    return False
                mine = [d for v in chosen for d in v.devices if d.index == g.index]
                if kind == "mig":
                    return any(d.kind == "mig" and g.slices.get(d.slice_start) is not None
                               and g.slices[d.slice_start].profile == job.mig_profile for d in mine)
                users = Counter(u for _, u, _ in g.clients)
                users.subtract(v.user for v in chosen)
                left = sum(m for _, _, m in g.clients) - sum(d.mem_mb or 0 for d in mine)
                return (len(g.clients) - len(chosen) < g.view.mps_max_clients and left + want <= g.view.memory_mb
                        and all(u == job.user for u, n in users.items() if n > 0))
            victims = pre.reclaim_fraction(i, gi, pool, room, self.share_of)
            if victims is not None and (best is None or (len(victims), i, gi) < best[0]):
                best = ((len(victims), i, gi), i, victims)
        if best is None:
            return False
        _, i, victims = best
        self.preempt(job, Choice(i, victims, ()), frozenset(), pool, [self.share_of(v) for v in victims])
        self.reasons[job.job_id] = "Resources"
        return True

    # -- gangs and node filters (gang.py) -------------------------------------------------------------
    def gangs(self) -> Gangs:
        if self._gangs is None:
            self._gangs = Gangs(self.cluster, self.timeline, self.now)
        return self._gangs

    def consider_gang(self, job: PendingJob, may_borrow: bool) -> bool:
        """Steps b-h for a multi-node job or one that names nodes, features or exclusivity."""
        reasons, book = self.reasons, self.book
        req = Request.of(job)
        refusal = self.misconfigured(job)
        if refusal is None and (job.nodes < 1 or job.gpus % job.nodes):
            refusal = "BadConstraints"
        if refusal is None:
            refusal = self.gangs().fit(req).verdict
        if refusal:
            reasons[job.job_id] = refusal
            return True
        limit = book.limit_reason(job.qos, job.user, job.account, job.gpus)
        if limit:
            reasons[job.job_id] = limit
            return True
        within = not book.enabled or book.within(job.account, job.gpus)
        if not within and not may_borrow:
            return False
        switches = switch_limit(job, self.now)
        shape = ("gang", req, switches)
        blocked = False
        if job.partition in self.waiting and not self.cfg.backfill:
            blocked = True
        elif shape not in self.failed_shapes:
            chosen, blocked = self.gangs().place_now(req, self.cfg.placement_for(job.partition), switches,
                                                     lambda i: self.gang_delays(i, req, job))
            if chosen is not None:
                self.start_gang(job, req, chosen, borrowed=not within)
                return True
            self.failed_shapes.add(shape)
        may_preempt = req.nodes == 1 and not req.exclusive and self.may_preempt.get(job.qos, True)
        found = None
        if self.depth_left > 0 or may_preempt:
            found = self.gangs().earliest(req, self.cfg.placement_for(job.partition), switches)
        if found is not None and found[0] <= self.now:            # e. resources on their way back
            self.reserve_gang(job, req, *found, within=within)
        elif may_preempt and self.preempt_on(job, req, within):   # f. preempt, on its candidates only
            pass
        elif found is not None and self.depth_left > 0:           # g. reserve
            self.depth_left -= 1
            self.reserve_gang(job, req, *found, within=False)
        if job.job_id not in reasons:
            first = not blocked and job.partition not in self.waiting
            reasons[job.job_id] = "Resources" if first else "Priority"
        self.waiting.add(job.partition)
        return True

    def reserve_gang(self, job: PendingJob, req: Request, t: float, chosen: list[int], within: bool) -> None:
        for i in chosen:
            g, cpus, mem, model = self.gangs().share(i, req)
            self.timeline.reserve(job.job_id, i, t, job.time_limit, g, cpus, mem, model)
        self.plan.expected_starts[job.job_id] = t
        self.plan.reserved_nodes[job.job_id] = self.cluster.nodes[chosen[0]].name
        if t <= self.now and within:
            self.book.on_claim(job.account, job.gpus)

    def preempt_on(self, job: PendingJob, req: Request, within: bool) -> bool:
        """Step f for a single-node job that names nodes or features: victims on its candidates."""
        targets = self.targets.get(job.qos, frozenset())
        reclaim = within and job.gpus > 0 and self.book.enabled
        if not targets and not reclaim:
            return False
        pool = self.book.pool(job.account)
        pkey = ("filtered", req, targets, reclaim, pool)
        if not self.worth_a_search(job, pkey, targets, reclaim, pool):
            return False
        choice = self.preemptor().select(job.partition, req.gpus, req.cpus, req.mem, req.model, job.time_limit,
                                         targets=targets, reclaim=reclaim, for_pool=pool,
                                         allowed=self.gangs().allowed(req))
        return self.preempt_for(job, choice, pkey, targets, pool, within)

    def gang_delays(self, i: int, req: Request, job: PendingJob) -> bool:
        """Whether taking node ``i`` for the job now would delay a reservation on it."""
        c = self.cluster
        if req.exclusive:
            return not self.timeline.no_delay(i, tuple(c.free[i]), c.cpus[i], c.mem[i], self.end_of(job))
        return not self.timeline.no_delay(i, c.pick(i, req.gpus, req.model), req.cpus, req.mem, self.end_of(job))

    def start_gang(self, job: PendingJob, req: Request, chosen: list[int], borrowed: bool) -> None:
        c, tl, end = self.cluster, self.timeline, self.end_of(job)
        placed = []
        for i in chosen:        # rank order: node name order
            gpus = c.pick(i, req.gpus, req.model)
            if req.exclusive:   # the whole node is held; the job is given what it asked for
                c.allocate(i, tuple(c.free[i]), c.cpus[i], c.mem[i])
                c.exclusive.add(i)
                tl.add_start(i, tuple(c.model_of[i]), c.total_cpus[i], c.total_mem[i], end, job.job_id)
            else:
                c.allocate(i, gpus, req.cpus, req.mem)
                tl.add_start(i, gpus, req.cpus, req.mem, end, job.job_id)
            placed.append(Part(c.nodes[i].name, gpus, req.cpus, req.mem))
        self.book.on_start(job.account, job.qos, job.user, job.gpus)
        first = placed[0]
        self.plan.starts.append(Start(job.job_id, first.node, first.gpu_indices, first.cpus, first.mem_mb,
                                      borrowed=borrowed and job.gpus > 0, parts=tuple(placed[1:])))

    # -- steps e-g: a job that cannot start now -----------------------------------------------------
    def wait(self, job: PendingJob, shape: tuple, within: bool) -> None:
        targets = self.targets.get(job.qos, frozenset())
        reclaim = within and job.gpus > 0 and self.book.enabled
        if self.depth_left <= 0 and not targets and not reclaim:
            return
        pool = self.book.pool(job.account)
        pkey = (shape, targets, reclaim, pool)
        may_preempt = (bool(targets) or reclaim) and self.worth_a_search(job, pkey, targets, reclaim, pool)
        if self.depth_left <= 0 and not may_preempt:
            return
        best = self.timeline.earliest(*shape)
        # e. resources already on their way back are enough
        if best is not None and best[0] <= self.now:
            self.reserve(job, best[1], within)
            return
        # f. preempt
        if may_preempt:
            choice = self.preemptor().select(*shape, targets=targets, reclaim=reclaim, for_pool=pool)
            if self.preempt_for(job, choice, pkey, targets, pool, within):
                return
        # g. reserve (backfill)
        if best is not None and self.depth_left > 0:
            self.depth_left -= 1
            self.reserve(job, best[1], within=False, at=best[0])

    def worth_a_search(self, job: PendingJob, pkey: tuple, targets: frozenset[str], reclaim: bool,
                       pool: str | None) -> bool:
        """Whether a victim search for ``pkey`` is worth running: none failed for it this pass,
        and candidates and rate budget are left for its kind (once not, that is remembered)."""
        if pkey in self.failed_preempts or (targets, reclaim, pool) in self.failed_preempts:
            return False
        if not self.preemptor().worth_trying(targets, reclaim, pool):
            self.failed_preempts.add((targets, reclaim, pool))   # no candidates or budget left
            if not reclaim:
                self.may_preempt[job.qos] = False
            return False
        return True

    def preempt_for(self, job: PendingJob, choice: Choice | None, pkey: tuple, targets: frozenset[str],
                    pool: str | None, within: bool) -> bool:
        """Stop ``choice``'s victims and hold their node for ``job``; False (remembered for
        ``pkey``) when the search found none."""
        if choice is None:
            self.failed_preempts.add(pkey)
            return False
        self.preempt(job, choice, targets, pool)
        self.reserve(job, choice.node, within)
        self.reasons[job.job_id] = "Resources"
        return True

    def reserve(self, job: PendingJob, i: int, within: bool, at: float | None = None) -> None:
        t = self.now if at is None else at
        self.timeline.reserve(job.job_id, i, t, job.time_limit, job.gpus, job.cpus, job.mem_mb, job.gpu_type)
        self.plan.expected_starts[job.job_id] = t
        self.plan.reserved_nodes[job.job_id] = self.cluster.nodes[i].name
        if at is None and within:
            self.book.on_claim(job.account, job.gpus)

    def preemptor(self) -> Preemptor:
        if self._preemptor is None:
            self._preemptor = Preemptor(self.cfg, self.snap.running, self.cluster, self.timeline, self.book,
                                        self.prio.of_running, self.snap.recent_preemptions, self.now)
        return self._preemptor

    def preempt(self, job: PendingJob, choice: Choice, targets: frozenset[str], pool: str | None,
                amounts: list[float] | None = None) -> None:
        self.preemptor().commit(choice, amounts)
        for v in choice.victims:
            vq = self.cfg.qos.get(v.qos)
            mode = vq.preempt_mode if vq is not None else "requeue"
            if mode == "requeue" and not v.requeue:
                mode = "cancel"   # a job that asked not to be requeued is cancelled instead
            why = f"QOS {job.qos} preempts {v.qos}" if v.qos in targets else f"quota reclaim for account {pool}"
            self.plan.preemptions.append(Preemption(
                job_id=v.job_id, mode=mode, grace_time=vq.grace_time if vq is not None else 0.0,
                reason=why, for_job=job.job_id))

