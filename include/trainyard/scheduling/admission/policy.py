"""The admission policy, pure: given the fleet (resources.yaml), the ledger's entries and the time, a
verdict for every waiting job. No storage, no clock, no Airflow: the ledger (:mod:`.ledger`) applies it in
one transaction, ``trainyard queue`` and the scheduler replay (``bench/scheduler.py``) read it as it is, and
:mod:`.starts` runs it forward to say when each waiting job starts.

A verdict is typed, as Kueue's workload conditions are: a :class:`Standing` (admitted, waiting,
inadmissible, cancelled), for a waiting job a :class:`WaitReason` a program compares, and the message a
person reads, written here once for the ``admit`` log, ``trainyard queue`` and the report.

The rules (the package's docstring says why):

* never more slots of a type admitted than it has; a team never above its quota plus what it may borrow;
  borrowing only from what other teams lend of their idle quota and from slots in nobody's quota, and
  what a team does not lend stays its own (``ResourcesConfig.lent``);
* order among waiting jobs of a type: a job that waited ``scheduling.max_wait_minutes`` first; then jobs
  within their team's quota before jobs that would borrow; then ``resources.priority``; then arrival;
* backfill, except that behind a job within its quota that waits for slots no job may borrow, and a job
  that has waited ``max_wait_minutes`` for slots holds a reservation (:func:`_reserved_start`,
  :func:`_would_delay`: EASY backfill, as in Slurm);
* with the teams' spend, a team's admitted jobs' commitments stay within its monthly budget's rest;
* a sweep has at most ``sweep.parallelism`` trials admitted at once;
* where workers announce the GPU types they serve (``served``), a job waits while no live worker serves
  its type with enough devices on one host (a multi-node job: on as many hosts as it has nodes), without
  holding anything back (:func:`unserved`);
* with :class:`PreemptionRules`, a job within its team's quota reclaims the slots other teams borrow of
  it (:func:`reclaim`): the ledger marks the jobs it preempts, their trainings hear it through their
  lease, checkpoint and stop, and wait again in their places (:mod:`.lease`).
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainyard.scheduling.resources import ResourcesConfig

if TYPE_CHECKING:
    from trainyard.scheduling.budgets import Spend


@dataclass(frozen=True)
class Job:
    id: str  # the run key: "<dag_id>/<run_id>"
    team: str
    gpu_type: str
    slots: int
    priority: int
    max_hours: float  # resources.max_hours: its worst case counts against the team's budget while admitted
    user: str = ""  # who triggered the run ("" for a schedule): shown by `trainyard queue`
    group: str = ""  # a sweep's trials share one: its run key
    group_limit: int = 0  # at most this many jobs of the group admitted at once (sweep.parallelism); 0: any
    nodes: int = 1  # hosts its slots are spread over, slots / nodes on each (resources.nodes): admitted together

    @property
    def per_node(self) -> int:
        """The slots (devices) each of its nodes holds: resources.gpus_per_node."""
        return self.slots // self.nodes


@dataclass(frozen=True)
class Entry:
    job: Job
    enqueued: float
    admitted: float | None  # None while waiting
    borrowed: int  # slots beyond the team's quota when it was admitted
    lease_until: float
    devices: tuple[str, ...] = ()  # the GPUs of ``host`` it was given (Ledger.claim_devices)
    host: str = ""  # the worker host whose devices those are ("": a ledger of one host, from before hosts)
    preemptions: int = 0  # how often it was preempted so far
    preempted_for: str = ""  # the job it is being preempted for, until its processes have ended
    waiting_since: float = 0.0  # a preempted job: when it waits again (0: since its arrival)

    @property
    def waiting_from(self) -> float:
        """Since when it waits for slots: its arrival, or a preempted job's return to the queue. The wait
        bound counts from it (a preempted job has run: it does not pass the job it gave its slots to)."""
        return max(self.enqueued, self.waiting_since)

    @property
    def group_member(self) -> bool:
        """A sweep's trial: never preempted (a trial's task that ran again would train a new trial, not
        resume this one)."""
        return bool(self.job.group)


class Standing(enum.StrEnum):
    ADMITTED = "admitted"
    WAITING = "waiting"
    INADMISSIBLE = "inadmissible"  # its team or GPU type is not in the resources in force: it never starts
    CANCELLED = "cancelled"  # taken out of the queue (trainyard queue cancel): it never starts
    PREEMPTED = "preempted"  # admitted, and told to checkpoint and give its slots back to a job within its quota


class WaitReason(enum.StrEnum):
    """Why a waiting job waits. ``fleet``: what holds it back is the type's slots (a job within its quota
    that waits for them keeps borrowers back; one that waited past the bound holds a reservation)."""

    SLOTS_IN_USE = "slots_in_use"  # the type has too few free slots
    BORROWING_LIMIT = "borrowing_limit"  # its team would pass its quota plus what it may borrow
    NOT_LENDABLE = "not_lendable"  # it would borrow more than the other teams lend now
    QUOTA_LENT_OUT = "quota_lent_out"  # its own quota is lent out; the free slots are others' reserve
    SWEEP_PARALLELISM = "sweep_parallelism"  # its sweep has sweep.parallelism trials admitted
    NO_BORROWING = "no_borrowing"  # it would borrow, behind a job that waits for its team's own quota
    RESERVATION = "reservation"  # it could delay a job that holds a reservation
    BUDGET = "budget"  # its commitment does not fit in its team's monthly budget's rest
    PREEMPTING = "preempting"  # within its quota, it waits for borrowers it preempted to checkpoint and stop
    UNSERVED = "unserved"  # no live worker serves its GPU type, or none has as many of its devices
    FITS_NOW = "fits_now"  # nothing holds it back: its next look admits it (trainyard queue only)
    UNKNOWN = "unknown"  # no verdict of the policy for it (its row was gone by the decision)

    @property
    def fleet(self) -> bool:
        return self in _FLEET_REASONS


# asked of every held-back job in a decision, twice with preemption on: a set's look-up, not a tuple's comparisons
_FLEET_REASONS = frozenset(
    {WaitReason.SLOTS_IN_USE, WaitReason.NOT_LENDABLE, WaitReason.QUOTA_LENT_OUT, WaitReason.PREEMPTING}
)


@dataclass(frozen=True)
class Verdict:
    """What the ledger says of a job: its standing, for a waiting one why (``reason``), for an admitted one
    the slots it borrowed, and the ``message`` a person reads."""

    standing: Standing
    message: str
    reason: WaitReason | None = None
    borrowed: int = 0
    preempted_for: str = ""  # a preempted job's: the job it gives its slots back to

    @property
    def admitted(self) -> bool:
        return self.standing is Standing.ADMITTED

    @property
    def final(self) -> bool:
        """Whether the job will never be admitted: its task ends failed, with the message."""
        return self.standing in (Standing.CANCELLED, Standing.INADMISSIBLE)

    @classmethod
    def admit(cls, job: Job, borrowed: int) -> Verdict:
        of_them = f", {borrowed} of them borrowed" if borrowed else ""
        message = f"admitted: {job.slots} {job.gpu_type} slot(s) for team {job.team}{of_them}"
        return cls(Standing.ADMITTED, message, borrowed=borrowed)

    @classmethod
    def wait(cls, reason: WaitReason, message: str) -> Verdict:
        return cls(Standing.WAITING, message, reason)


def inadmissible(config: ResourcesConfig, job: Job) -> Verdict | None:
    """The verdict on a job ``config`` can never admit (its team or GPU type is not in it), or None."""
    if job.team in config.teams and job.gpu_type in config.slot_types:
        return None
    missing = [
        f"{what} {name!r} is not in resources.yaml (it lists {sorted(listed)})"
        for what, name, listed in (("team", job.team, config.teams), ("GPU type", job.gpu_type, config.slot_types))
        if name not in listed
    ]
    message = f"inadmissible: {'; '.join(missing)}; trigger the job again with one it lists, or add it back"
    return Verdict(Standing.INADMISSIBLE, message)


def beyond_quota(held: int, slots: int, quota: int) -> int:
    """The slots of a new job of ``slots`` that its team, holding ``held``, would borrow: those beyond its
    quota, not counting what it borrows already."""
    return max(0, held + slots - max(quota, held))


def _usage(config: ResourcesConfig, entries: list[Entry], gpu_type: str) -> dict[str, int]:
    used = dict.fromkeys(config.teams, 0)
    for e in entries:
        if e.admitted is not None and e.job.gpu_type == gpu_type:
            used[e.job.team] += e.job.slots
    return used


def _room(config: ResourcesConfig, used: dict[str, int], job: Job) -> int | Verdict:
    """The slots ``job`` would borrow if it fits now, else the verdict that it waits."""
    t, team = job.gpu_type, job.team
    capacity = config.slot_types[t].slots
    in_use = sum(used.values())
    quota = config.quota(team, t)
    borrow = beyond_quota(used[team], job.slots, quota)
    limit = config.borrowing_limit(team, t)
    if borrow and limit is not None and max(0, used[team] - quota) + borrow > limit:
        message = f"team {team} holds {used[team]} of quota {quota} and may borrow at most {limit}"
        return Verdict.wait(WaitReason.BORROWING_LIMIT, message)
    if in_use + job.slots > capacity:
        message = f"{t}: {in_use} of {capacity} slots in use, the job needs {job.slots}"
        return Verdict.wait(WaitReason.SLOTS_IN_USE, message)
    borrowed, lendable = config.lent(t, {**used, team: used[team] + job.slots})
    before = config.lent(t, used)
    # A job may not make the fleet lend more than the lending limits allow; where it already does (limits
    # lowered in the file since), a job that makes it no worse still starts.
    if borrowed - lendable > max(0, before[0] - before[1]):
        if borrow:  # what was lendable before this job
            left = lendable - (borrowed - borrow)
            message = f"{t}: the job would borrow {borrow} slots, {max(left, 0)} are lendable now"
            return Verdict.wait(WaitReason.NOT_LENDABLE, message)
        # A lender taking its quota back while borrowers hold it: the free slots are other teams' reserve
        # (what they do not lend). It starts as the borrowers finish; nothing running is preempted.
        message = (
            f"{t}: team {team}'s quota is lent out and the free slots are other teams' reserve; "
            "it starts as the borrowers finish"
        )
        return Verdict.wait(WaitReason.QUOTA_LENT_OUT, message)
    return borrow


@dataclass(frozen=True)
class PreemptionRules:
    """When running jobs give lent GPUs back. One rule, stated once (:func:`reclaim`): a job that fits its
    team's nominal quota reclaims the GPUs other teams borrow from it; no thrash: an admitted job runs at
    least ``min_runtime_s`` before it may be preempted, and one preempted ``max_preemptions`` times is not
    preempted again."""

    min_runtime_s: float = 600.0
    max_preemptions: int = 2

    @classmethod
    def of(cls, config: ResourcesConfig) -> PreemptionRules | None:
        """The rules of ``config`` (``scheduling.preemption``); None where preemption is off."""
        said = config.scheduling.preemption
        return cls(said.min_runtime_minutes * 60, said.max_preemptions) if said.enabled else None

    def may_preempt(self, e: Entry, now: float) -> bool:
        return (
            e.admitted is not None and now - e.admitted >= self.min_runtime_s and e.preemptions < self.max_preemptions
        )


# The sets of victims searched for the fewest: at most 4095, of the first 12 in preemption order. Where none
# of them frees enough (a job within its quota whose borrowers hold it in many small pieces), the victims are
# taken in preemption order until enough is free, less those not needed (reclaim).
MAX_RECLAIM_CANDIDATES = 12


def reclaim(
    config: ResourcesConfig,
    entries: list[Entry],
    job: Job,
    used: dict[str, int],
    now: float,
    rules: PreemptionRules,
    claimed: frozenset[str] = frozenset(),
) -> list[Entry] | None:
    """The running jobs to preempt so that ``job``, which fits its team's nominal quota of its GPU type,
    starts: jobs of that type of other teams that were admitted on borrowed slots (``Entry.borrowed``), and
    whose team stays at or above its quota without them (what is taken back is borrowed, never another
    team's own quota); where its team's policy says ``preempt_by_priority``, also its own team's jobs of a
    lower priority, so that it runs within its quota. Never a sweep's trial (``Entry.group_member``). The
    fewest jobs that free enough for ``job`` by every rule of :func:`_room`, and among as many, the first in
    preemption order (the lowest priority first, then the most recently admitted), searched among the first
    :data:`MAX_RECLAIM_CANDIDATES` in that order. Where no set of those frees enough, the jobs in that order
    until enough is free, less each of them (the last first) that is not needed: few, not always the fewest.
    ``used``: each team's slots once the jobs already being preempted have ended and the jobs they were
    preempted for run;
    ``claimed``: jobs another waiting job preempts in this decision. None where ``job`` would borrow itself,
    or no such jobs free enough: it waits as before."""
    t, quota = job.gpu_type, config.quota(job.team, job.gpu_type)
    by_priority = config.teams[job.team].policy.preempt_by_priority
    if job.slots > quota or (used[job.team] + job.slots > quota and not by_priority):
        return None

    def candidate(e: Entry) -> bool:
        if e.job.team == job.team:  # its own team's, where the team's policy says so: a lower priority
            return by_priority and e.job.priority < job.priority
        return e.borrowed > 0  # another team's: only what it borrows

    in_order = sorted(
        (
            e
            for e in entries
            if e.job.gpu_type == t
            and candidate(e)
            and not e.group_member
            and not e.preempted_for
            and e.job.id not in claimed
            and rules.may_preempt(e, now)
        ),
        key=lambda e: (e.job.priority, -(e.admitted or 0.0), e.job.id),
    )

    def left(victims: tuple[Entry, ...]) -> dict[str, int] | None:
        """Each team's slots once ``victims`` have stopped; None where that takes another team's own quota."""
        held = dict(used)
        for v in victims:
            held[v.job.team] -= v.job.slots
            if v.job.team != job.team and held[v.job.team] < config.quota(v.job.team, t):
                return None
        return held

    def frees_enough(held: dict[str, int] | None) -> bool:  # it runs within its quota, by every rule
        return (
            held is not None
            and held[job.team] + job.slots <= quota
            and not isinstance(_room(config, held, job), Verdict)
        )

    first = in_order[:MAX_RECLAIM_CANDIDATES]
    for size in range(1, len(first) + 1):
        for victims in itertools.combinations(first, size):
            if frees_enough(left(victims)):
                return list(victims)
    if len(in_order) == len(first):  # every set was looked at
        return None
    return _walk(in_order, lambda victims: frees_enough(left(victims)), lambda victims: left(victims) is None)


def _walk(
    in_order: list[Entry],
    frees_enough: Callable[[tuple[Entry, ...]], bool],
    takes_a_quota: Callable[[tuple[Entry, ...]], bool],
) -> list[Entry] | None:
    """:func:`reclaim`'s victims beyond its search: ``in_order`` taken one by one (each that would take
    its team below its own quota passed over) until they free enough, less each of them, the last first,
    that is not needed (another team's low priority comes first in the order but frees nothing of the
    lender's own team's quota); a victim let go only raises its team's slots."""
    taken: tuple[Entry, ...] = ()
    for e in in_order:
        if takes_a_quota((*taken, e)):
            continue
        taken = (*taken, e)
        if frees_enough(taken):
            for v in reversed(taken):
                rest = tuple(k for k in taken if k is not v)
                if frees_enough(rest):
                    taken = rest
            return list(taken)
    return None


def _preempting(
    config: ResourcesConfig,
    entries: list[Entry],
    job: Job,
    after: dict[str, int],
    now: float,
    rules: PreemptionRules,
    claimed: set[str],
) -> dict[str, Verdict] | None:
    """The verdicts where a waiting ``job`` within its quota preempts (or already preempts) borrowers: it
    waits for them, saying for whom; each of them is told to give its slots back. None where it does not.
    ``entries``: the admitted jobs of its type; ``after``: the teams' use once the preemptions under way
    (and those decided in this pass) are done, which this one updates; ``claimed``: the jobs preempted in
    this pass, which it adds to."""
    ongoing = [e for e in entries if e.preempted_for == job.id]
    victims = ongoing or reclaim(config, entries, job, after, now, rules, frozenset(claimed))
    if not victims:
        return None
    if not ongoing:
        for v in victims:
            after[v.job.team] -= v.job.slots
        after[job.team] += job.slots
        claimed.update(v.job.id for v in victims)
    slots = sum(v.job.slots for v in victims)
    # the same description once, with how many: 20 borrowers of one slot are one phrase, not 20
    named = ", ".join(d if n == 1 else f"{n} x {d}" for d, n in Counter(_seen_by_all(v.job) for v in victims).items())
    wait = (
        f"reclaiming {slots} {job.gpu_type} slot(s) of team {job.team}'s quota from {named}; "
        "it starts when they have stopped"
    )
    return {job.id: Verdict.wait(WaitReason.PREEMPTING, wait), **{v.job.id: preempted_for(job) for v in victims}}


def preempted_for(job: Job) -> Verdict:
    """The verdict on a running job preempted for ``job`` (named as every team may read it), until its
    processes have ended."""
    message = f"preempted for {_seen_by_all(job)} within its quota: checkpointing and giving its slots back"
    return Verdict(Standing.PREEMPTED, message, preempted_for=job.id)


def _reserved_start(free: int, running: list[tuple[float, int, str]], need: int, now: float) -> float:
    """The time by which ``need`` slots are free at the latest, with ``free`` free now and ``running``
    the (end by its max_hours, slots, team) of the jobs holding the rest; one past its end counts as
    ending now."""
    at = now
    for end, slots, _ in sorted(running):
        if free >= need:
            break
        free += slots
        at = max(at, end)
    return at


def _would_delay(
    config: ResourcesConfig,
    starving: Job,
    job: Job,
    used: dict[str, int],
    running: list[tuple[float, int, str]],
    now: float,
) -> bool:
    """Whether admitting ``job`` now could keep ``starving`` from starting at its reserved start: the
    time enough slots are free if every running job ends by its max_hours. With ``job`` admitted, the jobs
    still running then (``job`` too, unless it ends by then) must leave the starving job room by every
    rule of :func:`_room`: the slots, its team's borrowing limit, and what the others lend. A starving job
    that a limit other than the slots holds back has no room at its reserved start either, so nothing
    that borrows or is of its team passes it."""
    capacity = config.slot_types[starving.gpu_type].slots
    reserved = _reserved_start(capacity - sum(used.values()), running, starving.slots, now)
    then = dict.fromkeys(used, 0)
    for end, slots, team in [*running, (now + job.max_hours * 3600, job.slots, job.team)]:
        if reserved <= now or end > reserved:
            then[team] += slots
    return isinstance(_room(config, then, starving), Verdict)


def _seen_by_all(job: Job) -> str:
    """Another job named in a waiting job's reason, which that job's team reads (its admit log, ``trainyard
    queue``): as its team and size, what anyone may see of it (``trainyard.teams.SEEN_BY_OTHERS``)."""
    return f"team {job.team}'s job of {job.slots} {job.gpu_type} slot(s)"


class _Commitments:
    """What each team's admitted jobs may still cost, against its monthly budget's rest (with ``spend``;
    without it, or for a team without a budget, nothing is counted)."""

    def __init__(self, config: ResourcesConfig, spend: Spend | None, admitted: list[Job]) -> None:
        self.config, self.spend = config, spend
        self.committed = dict.fromkeys(config.teams, 0.0)
        for job in admitted:
            self.committed[job.team] += self.owed(job)

    def owed(self, job: Job) -> float:
        """The job's commitment where a budget gates its team (reading its run's usage file), else 0."""
        if self.spend is None or self.config.teams[job.team].monthly_budget is None:
            return 0.0
        from trainyard.scheduling.budgets import commitment

        return commitment(self.config, job, self.spend.of_run(job.id))

    def refusal(self, job: Job, cost: float) -> Verdict | None:
        budget = self.config.teams[job.team].monthly_budget
        if self.spend is None or budget is None:
            return None
        spend, team = self.spend, job.team
        left = budget - spend.this_month.get(team, 0.0) - spend.reserved.get(team, 0.0) - self.committed[team]
        if cost <= left:
            return None
        message = f"team {team}'s budget: {max(left, 0):.2f} left, the job may cost {cost:.2f}"
        return Verdict.wait(WaitReason.BUDGET, message)


def unserved(entries: list[Entry], served: Mapping[str, Sequence[float]]) -> dict[str, Verdict]:
    """The waiting jobs no live workers can run (``served``: GPU type -> how many of its devices each live
    host serving it has, ``math.inf`` for a type whose slots are no devices): their type is served by none,
    or by fewer hosts with as many of its devices as each of the job's nodes needs (``slots / nodes``) than
    it has nodes. They wait, holding nothing back; a worker that starts serving the type lets them in at the
    next decision."""
    verdicts = {}
    for e in entries:
        t, nodes = e.job.gpu_type, e.job.nodes
        per_node = e.job.per_node
        if e.admitted is not None or sum(count >= per_node for count in served.get(t, ())) >= nodes:
            continue
        if t not in served:
            message = (
                f"{t}: no live worker serves it (the workers serve {sorted(served) or 'nothing'}): it starts once "
                f"one whose TRAINYARD_GPU_DEVICES lists {t} runs `trainyard worker`"
            )
        elif nodes == 1:
            most = max(served[t])
            message = f"{t}: the job needs {per_node} devices on one host, and the live workers have {most:.0f} at most"
        else:
            enough = sum(count >= per_node for count in served[t])
            message = (
                f"{t}: the job's {nodes} nodes need {nodes} hosts with {per_node} of its devices each, and "
                f"{enough} live host(s) have them"
            )
        verdicts[e.job.id] = Verdict.wait(WaitReason.UNSERVED, message)
    return verdicts


def plan(
    config: ResourcesConfig,
    entries: list[Entry],
    now: float,
    spend: Spend | None = None,
    preemption: PreemptionRules | None = None,
    admissions_only: bool = False,
    served: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Verdict]:
    """Every waiting job's verdict now: job id -> admitted (with the slots it borrows) or waiting (and why), per GPU
    type in the order the jobs are looked at (past the bound on waiting first, then within quota, then by priority,
    then by arrival): a waiting job's place in its queue. ``spend``: with it, a job is admitted only while its
    commitment and those of its team's admitted jobs and Kubernetes trainings
    (:func:`trainyard.scheduling.budgets.commitment`) fit in what the team's monthly budget has left after this
    month's spend. ``preemption``: with it, a waiting job within its quota reclaims what others borrow of it
    (:func:`reclaim`), and the jobs it preempts have a verdict too (:attr:`Standing.PREEMPTED`).
    ``admissions_only``: without ``preemption``, the verdicts of a type's waiting jobs only until it is
    full, which admits no more (running the policy forward needs no more: :mod:`.starts`). ``served``: the
    types the live workers serve (:func:`unserved`); None where no worker announces any (one host, whose
    trainings run wherever Airflow runs its tasks)."""
    held_back = {} if served is None else unserved(entries, served)
    if held_back:
        entries = [e for e in entries if e.job.id not in held_back]
    commitments = _Commitments(config, spend, [e.job for e in entries if e.admitted is not None])
    in_group: dict[str, int] = {}  # a sweep's admitted trials
    for e in entries:
        if e.admitted is not None:
            in_group[e.job.group] = in_group.get(e.job.group, 0) + 1
    verdicts: dict[str, Verdict] = {}
    asked = {e.job.gpu_type for e in entries if e.admitted is None}  # a type nobody waits for has no verdicts
    for gpu_type in (t for t in config.slot_types if t in asked):
        verdicts.update(_plan_type(config, entries, gpu_type, now, commitments, in_group, preemption, admissions_only))
    verdicts.update(held_back)
    return verdicts


def _after_preemptions(entries: list[Entry], gpu_type: str, used: dict[str, int]) -> dict[str, int]:
    """The teams' use of ``gpu_type`` once the preemptions under way are done: each victim gone, the job it
    was preempted for running."""
    after = dict(used)
    # only an admitted job is preempted_for another (the ledger sets it on admitted rows; requeue clears both)
    victims = [e for e in entries if e.preempted_for and e.admitted is not None and e.job.gpu_type == gpu_type]
    if not victims:  # the usual case: nothing to look up among the waiting jobs
        return after
    for e in victims:
        after[e.job.team] -= e.job.slots
    waiting = {e.job.id: e.job for e in entries if e.admitted is None}
    for job_id in {e.preempted_for for e in victims}:
        if job_id in waiting:
            after[waiting[job_id].team] += waiting[job_id].slots
    return after


class _DecisionMemo:
    """What repeats within one type's decision, a queue of thousands asking the same questions once the type
    is full: the room of a team's job of a size (valid until an admission changes the use), and that a
    team's job of a size and priority reclaims nothing (valid until a preemption changes what is left)."""

    def __init__(self, holding: list[Entry]) -> None:
        self.rooms: dict[tuple[str, int], int | Verdict] = {}
        self.no_reclaim: set[tuple[str, int, int]] = set()
        self.preempted_for = {e.preempted_for for e in holding if e.preempted_for}

    def room(self, config: ResourcesConfig, used: dict[str, int], job: Job) -> int | Verdict:
        key = (job.team, job.slots)
        if key not in self.rooms:
            self.rooms[key] = _room(config, used, job)
        return self.rooms[key]

    def preempting(self, config: ResourcesConfig, holding: list[Entry], job: Job, *args) -> dict[str, Verdict] | None:
        """:func:`_preempting` (``args``: its ``after``, ``now``, ``rules`` and ``claimed``)."""
        key, ongoing = (job.team, job.slots, job.priority), job.id in self.preempted_for
        if not ongoing and key in self.no_reclaim:
            return None
        found = _preempting(config, holding, job, *args)
        if found is None:
            self.no_reclaim.add(key)
        elif not ongoing:
            self.no_reclaim.clear()  # it preempts: less is left to reclaim for the next
        return found


def _within(job: Job, used: dict[str, int], quotas: dict[str, int]) -> bool:
    """Whether ``job`` fits in its team's quota of the type, with the team's ``used`` slots of it."""
    return used[job.team] + job.slots <= quotas[job.team]


def _in_look_order(
    waiting: list[Entry], used: dict[str, int], quotas: dict[str, int], now: float, max_wait: float
) -> list[Entry]:
    """A type's waiting jobs in the order they are looked at: those that waited ``max_wait`` seconds or more
    first, then those within their team's quota (``quotas``, with its ``used`` slots), then by priority, by
    arrival and by id."""

    def key(e: Entry) -> tuple:
        job = e.job
        return (now - e.waiting_from < max_wait, not _within(job, used, quotas), -job.priority, e.enqueued, job.id)

    return sorted(waiting, key=key)


def _plan_type(
    config: ResourcesConfig,
    entries: list[Entry],
    gpu_type: str,
    now: float,
    commitments: _Commitments,
    in_group: dict[str, int],
    preemption: PreemptionRules | None = None,
    admissions_only: bool = False,
) -> dict[str, Verdict]:
    """:func:`plan` for the waiting jobs of one GPU type, in their order."""
    max_wait, capacity = config.scheduling.max_wait_minutes * 60, config.slot_types[gpu_type].slots
    used = _usage(config, entries, gpu_type)
    waiting = [e for e in entries if e.admitted is None and e.job.gpu_type == gpu_type]
    holding = [e for e in entries if e.admitted is not None and e.job.gpu_type == gpu_type]  # who may be preempted
    # (when it ends at the latest, slots, team): what a reservation counts on
    running = [((e.admitted or 0.0) + e.job.max_hours * 3600, e.job.slots, e.job.team) for e in holding]
    quotas = {team: config.quota(team, gpu_type) for team in config.teams}  # asked once or twice per waiting job
    after, claimed, memo = _after_preemptions(entries, gpu_type, used), set[str](), _DecisionMemo(holding)
    no_borrowing: Verdict | None = None
    starving: Entry | None = None  # a job past the bound, waiting for slots: it holds a reservation
    verdicts: dict[str, Verdict] = {}
    for e in _in_look_order(waiting, used, quotas, now, max_wait):
        if admissions_only and preemption is None and sum(used.values()) >= capacity:
            break
        job = e.job
        if job.group and job.group_limit and in_group.get(job.group, 0) >= job.group_limit:
            # the sweep's own cap: it holds nothing back for anyone else's job
            message = f"sweep {job.group} has {job.group_limit} trial(s) running, its parallelism"
            verdicts[job.id] = Verdict.wait(WaitReason.SWEEP_PARALLELISM, message)
            continue
        room = memo.room(config, used, job)
        if isinstance(room, int) and room > 0 and no_borrowing is not None:
            room = no_borrowing
        if (
            isinstance(room, int)
            and starving is not None
            and (room > 0 or job.team == starving.job.team)
            and _would_delay(config, starving.job, job, used, running, now)
        ):
            # what it would take, the starving job needs; other teams still get their own quota
            waited = (now - starving.waiting_from) / 60
            message = f"behind {_seen_by_all(starving.job)}, which has waited {waited:.0f} min"
            room = Verdict.wait(WaitReason.RESERVATION, message)
        cost = 0.0
        if isinstance(room, int):
            cost = commitments.owed(job)  # read only for a job that has the room
            room = commitments.refusal(job, cost) or room
        if isinstance(room, Verdict):
            preempting = None
            if (
                preemption is not None
                and room.reason is not None
                # the fleet holds it back, or its own team's jobs do (where they may be preempted by priority)
                and (room.reason.fleet or room.reason is WaitReason.BORROWING_LIMIT)
                and commitments.refusal(job, commitments.owed(job)) is None  # its budget would not keep it waiting
            ):
                preempting = memo.preempting(config, holding, job, after, now, preemption, claimed)
            verdicts.update(preempting or {job.id: room})
            room = verdicts[job.id]
            fleet = room.reason is not None and room.reason.fleet
            if fleet and starving is None and now - e.waiting_from >= max_wait:
                starving = e
            if fleet and _within(job, used, quotas):
                message = f"no borrowing while {_seen_by_all(job)} waits for its team's own quota"
                no_borrowing = Verdict.wait(WaitReason.NO_BORROWING, message)
            continue
        verdicts[job.id] = Verdict.admit(job, room)
        used[job.team] += job.slots
        memo.rooms.clear()
        running.append((now + job.max_hours * 3600, job.slots, job.team))
        in_group[job.group] = in_group.get(job.group, 0) + 1
        commitments.committed[job.team] += cost
    return verdicts
