"""The fleet inventory, ``include/config/resources.yaml``: GPU types, teams and their quotas, priority
classes, and the queueing bound; the Airflow pools made from it; the checks a JobSpec must pass against it.

Units: a GPU type's ``slots`` are what jobs ask for and quotas count: its GPUs, or, on a time-sliced type,
its GPUs x ``time_slicing.replicas`` (each replica is advertised as one ``nvidia.com/gpu`` with no memory
isolation, so a quota must count replicas, not GPUs). A type partitioned with MIG offers its profiles'
slices instead, each profile a slot type of its own (:attr:`ResourcesConfig.slot_types`), as each is a
resource of its own on Kubernetes.

A file that cannot describe a real fleet is refused with the line at fault: quotas that sum past a type's
slots, an unknown GPU type, a lending limit above the quota, a borrowing limit past what exists, MIG
slices that do not fit a GPU, a priority range upside down.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from trainyard import TRAINER_IMAGE
from trainyard.errors import spec_error_message
from trainyard.notifications import NOTICE_KINDS, NoticeKind
from trainyard.spec import JobSpec, SpecError, slot_type_of

POOL_PREFIX = "gpu-"
NAME = r"^[a-z0-9][a-z0-9-]{0,40}$"  # DNS-label-like: it names pools, namespaces and Kueue objects
MIG_PROFILE = re.compile(r"^(?P<g>[1-7])g\.(?P<gb>\d+)gb$")
MIG_COMPUTE_SLICES = 7  # an A100 / H100 splits into at most seven compute slices


def mig_compute(profile: str) -> int:
    """The compute slices of a MIG profile (1g.10gb: 1); 1 for a name that is no profile."""
    m = MIG_PROFILE.match(profile)
    return int(m["g"]) if m else 1


class ResourcesError(ValueError):
    """resources.yaml cannot be used; the message names the file, the line and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeSlicing(_Model):
    replicas: int = Field(ge=2, le=48, description="each GPU advertised this many times (shares, no memory isolation)")


class GpuType(_Model):
    count: int = Field(ge=1, description="GPUs of this type in the fleet")
    price_per_hour: float = Field(ge=0.0, description="per GPU (per slot on a time-sliced type)")
    description: str = ""
    node_selector: dict[str, str] = Field({}, description="the node labels of this type (Kubernetes)")
    mig_profiles: dict[str, int] = Field({}, description="MIG profile -> slices of it per GPU (mixed strategy)")
    time_slicing: TimeSlicing | None = None

    @property
    def slots(self) -> int:
        """What jobs ask for and quotas count: GPUs, or GPU shares on a time-sliced type."""
        return self.count * (self.time_slicing.replicas if self.time_slicing else 1)


class PriorityRange(_Model):
    min: int = Field(1, ge=1, le=1000)
    max: int = Field(1000, ge=1, le=1000)


class JobLimits(_Model):
    """What of its host a local training may use, per slot it holds (CPU and memory) and per job
    (processes): enforced on every training process, built-in or custom, by the local launcher."""

    cpus_per_slot: float = Field(4.0, gt=0, le=256, description="CPU cores per slot (a job's cap: this x its slots)")
    memory_gb_per_slot: float = Field(
        16.0, gt=0, le=4096, description="memory per slot in GiB (a job's cap: this x its slots; past it, OOM-killed)"
    )
    processes: int = Field(4096, ge=16, le=65536, description="the most processes and threads one job may have at once")


class TeamPolicy(_Model):
    """What a team's jobs may ask for beyond GPUs: checked by ``validate_spec`` and again where each thing
    is used (the Kubernetes launcher, the local launcher)."""

    namespaces: list[str] | None = Field(
        None, description="Kubernetes namespaces its jobs may run in (absent: 'trainyard' and trainyard-<team>)"
    )
    service_accounts: list[str] = Field(
        [], description="service accounts its pods may run as, besides the namespace's default one"
    )
    image_prefixes: list[str] = Field(
        [TRAINER_IMAGE.rsplit(":", 1)[0] + ":"], description="images its pods may run: names starting with one"
    )
    env: list[str] = Field(
        [], description="environment variables its jobs may set (kubernetes.env), as names or patterns (NCCL_*)"
    )
    custom_commands: bool = Field(False, description="whether it may run its own command (recipe: custom)")
    local_multi_node: bool = Field(
        False,
        description=(
            "whether its jobs may train on several nodes with the local launcher: their workers run outside the "
            "sandbox, as the worker's user, with their host's network (docs/security.md)"
        ),
    )
    max_gpus_per_job: int | None = Field(None, ge=1, description="the most GPUs (slots) one job may ask for")
    limits: JobLimits | None = Field(None, description="its jobs' host limits (absent: the file's top-level limits)")
    promoters: list[str] | None = Field(
        None,
        description=(
            "the members who may move its models' aliases (promote, roll back) and approve a move (absent: every "
            "member)"
        ),
    )
    approval: list[Literal["staging", "production"]] = Field(
        ["production"],
        description="aliases of its models whose moves wait for another promoter's approval (the promote_model DAG)",
    )
    preempt_by_priority: bool = Field(
        False,
        description=(
            "whether a job of the team whose quota its own jobs fill preempts the team's jobs of a lower "
            "resources.priority (as other teams' borrowers are preempted: checkpoint, wait again, resume), "
            "where scheduling.preemption.enabled"
        ),
    )


class NotifyTarget(_Model):
    """Where a team hears about its runs and models: an Airflow connection, by its type."""

    connection: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,250}$",
        description=(
            "an Airflow connection id: type http (a JSON webhook: POST to its host), smtp (e-mail to the "
            "addresses in its extra's 'to') or slackwebhook (a Slack incoming webhook)"
        ),
    )
    kinds: tuple[NoticeKind, ...] = Field(
        NOTICE_KINDS, min_length=1, description=f"the notices it takes (default: all of {', '.join(NOTICE_KINDS)})"
    )

    @model_validator(mode="before")
    @classmethod
    def _a_bare_id(cls, value: Any) -> Any:
        return {"connection": value} if isinstance(value, str) else value


class Team(_Model):
    description: str = ""
    notify: list[NotifyTarget] = Field(
        [], description="Airflow connections told about its runs and models (absent: the task log only)"
    )
    members: list[str] | None = Field(
        None, description="the Airflow users who may run its jobs ('*': everyone; absent: everyone)"
    )
    policy: TeamPolicy = TeamPolicy()
    quota: dict[str, int] = Field({}, description="GPU type -> nominal quota in slots (guaranteed)")
    borrowing_limit: dict[str, int] = Field(
        {}, description="GPU type -> slots it may use beyond its quota from others' idle quota (absent: no limit)"
    )
    lending_limit: dict[str, int] = Field(
        {}, description="GPU type -> slots of its idle quota others may borrow (absent: all of it)"
    )
    monthly_budget: float | None = Field(None, ge=0.0, description="spend per calendar month (None: unlimited)")
    priority: PriorityRange = PriorityRange()


class Preemption(_Model):
    enabled: bool = Field(
        True,
        description=(
            "a job that fits its team's nominal quota takes back the GPUs other teams borrow of it: their jobs "
            "checkpoint, stop and wait again in their places (false: lent GPUs come back as borrowers finish)"
        ),
    )
    min_runtime_minutes: float = Field(
        10.0, ge=0, description="an admitted job runs at least this long before it may be preempted"
    )
    max_preemptions: int = Field(2, ge=0, description="a job preempted this often is not preempted again")
    grace_seconds: float = Field(
        30.0,
        gt=0,
        le=600,
        description=(
            "from the word to the kill: the workers checkpoint and end within it (a custom program reads it "
            "in TRAINYARD_PREEMPTION_GRACE_S; torchrun kills its workers 30 s after a signal of its own)"
        ),
    )


class Scheduling(_Model):
    max_wait_minutes: float = Field(
        30.0,
        gt=0,
        description=(
            "a job that waited this long for slots holds a reservation: no job of its team and no borrower "
            "that could delay it passes it"
        ),
    )
    admission_poll_seconds: float = Field(
        10.0,
        gt=0,
        le=60,  # well inside the waiting lease (admission.WAITING_LEASE_S, 120 s) that each look renews
        description=(
            "how often a waiting job asks the admission ledger again, which renews its place in the queue; "
            "slots a finished job hands back do not wait for it (the triggerer's watch wakes a waiting job to "
            "look), other changes such as a raised quota do"
        ),
    )
    queue_wait_notice_minutes: float = Field(
        60.0,
        ge=0,
        description=(
            "a job that has waited this long for admission is told to its team once (notice queue_wait); 0: never"
        ),
    )
    kueue: bool = Field(
        False,
        description=(
            "Kubernetes trainings queue in Kueue (`trainyard cluster manifests`): their Jobs start suspended "
            "with the team's LocalQueue label, in the team's namespace"
        ),
    )
    preemption: Preemption = Preemption()


class ResourcesConfig(_Model):
    gpu_types: dict[str, GpuType]
    teams: dict[str, Team] = {"default": Team()}
    priority_classes: dict[str, int] = Field(
        {"low": 100, "normal": 500, "high": 900}, description="name -> value (Kubernetes PriorityClass / Kueue)"
    )
    scheduling: Scheduling = Scheduling()
    limits: JobLimits = Field(JobLimits(), description="every team's jobs' host limits, unless its policy sets its own")

    # slot type -> (its GPU type, slices of it per GPU: 1 for a type of whole GPUs or shares)
    _slot_types: dict[str, tuple[str, int]] = PrivateAttr(default_factory=dict)
    _slot_gpus: dict[str, GpuType] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        for name, gpu in self.gpu_types.items():
            if not gpu.mig_profiles:
                self._slot_types[name], self._slot_gpus[name] = (name, 1), gpu
                continue
            # a profile of no slices is _problems' to report (parse_resources), with the file's line
            profiles = {p: n for p, n in gpu.mig_profiles.items() if n >= 1}
            compute = sum(mig_compute(p) * n for p, n in profiles.items())
            for profile, per_gpu in profiles.items():
                slot = slot_type_of(name, profile)
                self._slot_types[slot] = (name, per_gpu)
                self._slot_gpus[slot] = GpuType(
                    count=gpu.count * per_gpu,
                    price_per_hour=gpu.price_per_hour * mig_compute(profile) / compute,
                    description=f"{gpu.description or name}: its {profile} slices",
                    node_selector=gpu.node_selector,
                )

    @property
    def slot_types(self) -> dict[str, GpuType]:
        """What slots are counted in: each GPU type of whole GPUs (or time-sliced shares), and for a type
        partitioned with MIG each of its profiles' slices as a type of its own, ``<type>.<profile>``, with
        count x slices per GPU slots, each priced at its share of the compute slices its GPU is cut into (a
        1g slice of a GPU cut into 3 x 1g + 2 x 2g costs 1/7 of its price; of one cut into 2 x 3g, 1/2).
        Pools, the ledger, quotas, budgets and Kueue's MIG resources count these; a job's is
        :attr:`trainyard.spec.Resources.slot_type`."""
        return self._slot_gpus

    def _per_gpu(self, slot_type: str) -> tuple[str, int]:
        """(its GPU type, slices of it per GPU); a name that is no slot type: itself, 1."""
        return self._slot_types.get(slot_type, (slot_type, 1))

    def job_limits(self, team: str) -> JobLimits:
        """The host limits of ``team``'s jobs: its policy's, else the file's."""
        return self.teams[team].policy.limits or self.limits

    def quota(self, team: str, slot_type: str) -> int:
        """``team``'s quota of ``slot_type``: of a MIG profile's slices, its quota of the GPU type x the
        profile's slices per GPU (as Kueue counts it)."""
        gpu_type, per_gpu = self._per_gpu(slot_type)
        return self.teams[team].quota.get(gpu_type, 0) * per_gpu

    def borrowing_limit(self, team: str, slot_type: str) -> int | None:
        gpu_type, per_gpu = self._per_gpu(slot_type)
        limit = self.teams[team].borrowing_limit.get(gpu_type)
        return None if limit is None else limit * per_gpu

    def lending_limit(self, team: str, slot_type: str) -> int:
        """What of ``team``'s quota of ``slot_type`` others may borrow while it is idle."""
        gpu_type, per_gpu = self._per_gpu(slot_type)
        t = self.teams[team]
        return t.lending_limit.get(gpu_type, t.quota.get(gpu_type, 0)) * per_gpu

    def lent(self, gpu_type: str, used: Mapping[str, int]) -> tuple[int, int]:
        """(borrowed, lendable) of ``gpu_type`` when each team holds ``used[team]`` slots: what the teams above
        their quota hold beyond it, and what may be lent: each other team's idle quota up to its lending
        limit, plus the slots in nobody's quota. Admission keeps borrowed <= lendable at every moment, so
        what a team keeps out of lending stays its own, also while it takes its lent quota back."""
        quota = {team: self.quota(team, gpu_type) for team in self.teams}
        borrowed = sum(max(0, used.get(team, 0) - q) for team, q in quota.items())
        lendable = self.slot_types[gpu_type].slots - sum(quota.values())
        lendable += sum(min(self.lending_limit(t, gpu_type), max(0, q - used.get(t, 0))) for t, q in quota.items())
        return borrowed, lendable

    def priority_class(self, priority: int) -> str:
        """The highest priority class whose value is at most ``priority`` (the lowest class if none is)."""
        ordered = sorted(self.priority_classes.items(), key=lambda kv: kv[1])
        below = [name for name, value in ordered if value <= priority]
        return below[-1] if below else ordered[0][0]


def _problems(cfg: ResourcesConfig) -> Iterable[tuple[tuple, str]]:
    """(the path of the field at fault, what is wrong) for each rule the types alone do not express."""
    for name in cfg.gpu_types:
        if not re.match(NAME, name):
            yield ("gpu_types", name), f"GPU type name {name!r}: lower-case letters, digits and '-'"
    for name, gpu in cfg.gpu_types.items():
        if gpu.mig_profiles and gpu.time_slicing:
            yield ("gpu_types", name, "mig_profiles"), "give mig_profiles or time_slicing, not both"
        slices = 0
        for profile, per_gpu in gpu.mig_profiles.items():
            m = MIG_PROFILE.match(profile)
            if not m:
                yield ("gpu_types", name, "mig_profiles", profile), f"MIG profile {profile!r}: write it as 1g.10gb"
                continue
            if per_gpu < 1:
                yield ("gpu_types", name, "mig_profiles", profile), f"{per_gpu} slices: at least 1"
            slices += int(m["g"]) * per_gpu
        if slices > MIG_COMPUTE_SLICES:
            yield (
                ("gpu_types", name, "mig_profiles"),
                f"the profiles take {slices} compute slices of a GPU; a GPU has {MIG_COMPUTE_SLICES}",
            )
    for name in cfg.teams:
        if not re.match(NAME, name):
            yield ("teams", name), f"team name {name!r}: lower-case letters, digits and '-'"
    for team_name, team in cfg.teams.items():
        for field in ("quota", "borrowing_limit", "lending_limit"):
            for gpu_type, value in getattr(team, field).items():
                where = ("teams", team_name, field, gpu_type)
                if gpu_type not in cfg.gpu_types:
                    yield where, f"unknown GPU type {gpu_type!r}; the file lists {sorted(cfg.gpu_types)}"
                    continue
                slots = cfg.gpu_types[gpu_type].slots
                if value < 0:
                    yield where, f"{value}: a number of slots is at least 0"
                elif field == "quota" and value > slots:
                    yield where, f"{value} slots, but {gpu_type} has {slots}"
                elif field == "lending_limit" and value > team.quota.get(gpu_type, 0):
                    yield where, f"lends {value} slots of a quota of {team.quota.get(gpu_type, 0)}"
                elif field == "borrowing_limit" and value > slots - team.quota.get(gpu_type, 0):
                    yield (
                        where,
                        f"{value} slots beyond a quota of {team.quota.get(gpu_type, 0)}, but {gpu_type} has {slots}",
                    )
        if team.priority.min > team.priority.max:
            yield ("teams", team_name, "priority"), f"min {team.priority.min} is above max {team.priority.max}"
    for gpu_type, gpu in cfg.gpu_types.items():
        holders = {t: team.quota[gpu_type] for t, team in cfg.teams.items() if team.quota.get(gpu_type, 0) > 0}
        if sum(holders.values()) > gpu.slots:
            last = list(holders)[-1]
            shares = " + ".join(f"{t} {q}" for t, q in holders.items())
            yield (
                ("teams", last, "quota", gpu_type),
                f"quotas over-commit {gpu_type}: {shares} = {sum(holders.values())} slots, but it has {gpu.slots}",
            )
    if not cfg.priority_classes:
        yield ("priority_classes",), "at least one priority class"
    for name, value in cfg.priority_classes.items():
        if not re.match(NAME, name):
            yield ("priority_classes", name), f"priority class name {name!r}: lower-case letters, digits and '-'"
        if not 1 <= value <= 1000:
            yield ("priority_classes", name), f"{value}: between 1 and 1000 (the JobSpec's resources.priority)"


def _line_of(text: str, path: tuple) -> int | None:
    """The 1-based line of ``path`` (keys from the top) in the YAML ``text``, or of its nearest parent."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            break
        for k, v in node.value:
            if k.value == str(key):
                line, node = k.start_mark.line + 1, v
                break
        else:
            break
    return line


def parse_resources(text: str, source: str = "resources.yaml") -> ResourcesConfig:
    """The inventory in ``text``; ResourcesError with ``source:line: field: problem`` for each fault."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ResourcesError(f"{source}: not YAML: {err}") from None
    faults: list[tuple[tuple, str]] = []
    try:
        cfg = ResourcesConfig.model_validate(raw)
    except ValidationError as err:
        faults = [(tuple(e["loc"]), e["msg"].removeprefix("Value error, ")) for e in err.errors()]
    else:
        faults = list(_problems(cfg))
    if faults:
        lines = []
        for path, msg in faults:
            line = _line_of(text, path)
            lines.append(f"{source}:{line if line else '?'}: {'.'.join(str(p) for p in path)}: {msg}")
        raise ResourcesError("\n".join(lines))
    return cfg


def default_config_dir() -> Path:
    return Path(os.environ.get("TRAINYARD_CONFIG_DIR", Path(__file__).resolve().parents[2] / "config"))


_loaded: dict[Path, tuple[tuple[int, int], ResourcesConfig]] = {}  # path -> ((mtime_ns, size), config)


def load_resources(path: str | os.PathLike | None = None) -> ResourcesConfig:
    """The inventory at ``path`` (default: the config folder's resources.yaml), parsed again only when the
    file changed (waiting jobs read it at every look)."""
    path = Path(path) if path else default_config_dir() / "resources.yaml"
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _loaded.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    config = parse_resources(path.read_text(), str(path))
    _loaded[path] = (stamp, config)
    return config


LAST_GOOD_FILE = "resources.last-good.yaml"  # in TRAINYARD_HOME/scheduling: the queue's fallback
_kept: dict[Path, tuple[int, int]] = {}  # path -> the stamp of the version last kept as the good one


def resources_in_force(
    path: str | os.PathLike | None = None, on_broken: Callable[[str], None] | None = None
) -> ResourcesConfig:
    """The inventory the queue runs on (the admission ledger, its waiting and training jobs): resources.yaml
    as it is now, kept as the last good version whenever it parses; where an edit broke it (or removed it),
    that last good version, so a typo fails no waiting or running job. ``on_broken`` (default: a warning in
    the log) is told what is wrong with the file, its line and field, at every look while it stays broken;
    ``trainyard pools sync`` and the set-up refuse the same file with the same message. Raises only when
    there is no good version to fall back on."""
    from trainyard import paths
    from trainyard.files import atomic_write

    path = Path(path) if path else default_config_dir() / "resources.yaml"
    kept = paths.home() / "scheduling" / LAST_GOOD_FILE
    try:
        config = load_resources(path)
    except (ResourcesError, FileNotFoundError) as err:
        if not kept.is_file():
            raise
        (on_broken or logging.getLogger(__name__).warning)(
            f"{err}\nthe queue keeps the last good version ({kept}) until resources.yaml is fixed"
        )
        return load_resources(kept)
    stamp = _loaded[path][0]
    if _kept.get(path) != stamp:
        text = path.read_text()
        try:
            parse_resources(text, str(path))  # what is kept must parse: the file may have changed since
        except ResourcesError:
            pass  # the next look reads the new version and falls back
        else:
            if not kept.is_file() or kept.read_text() != text:
                atomic_write(kept, text.encode())
        _kept[path] = stamp
    return config


def team_namespace(team: str) -> str:
    """The team's Kubernetes namespace (``trainyard cluster manifests`` creates it, with its LocalQueue)."""
    return f"trainyard-{team}"


def pool_name(gpu_type: str) -> str:
    return f"{POOL_PREFIX}{gpu_type}"


def pools(config: ResourcesConfig) -> dict[str, dict]:
    """Airflow pools, in the shape `airflow pools import` reads: one per slot type (a GPU type, or each
    profile of a type partitioned with MIG: :attr:`ResourcesConfig.slot_types`), a slot per GPU (per share
    on a time-sliced type, per slice), counting deferred tasks (a deferred training keeps its GPUs)."""
    return {
        pool_name(name): {
            "slots": gpu.slots,
            "description": f"{gpu.description or name}: {gpu.slots} slot(s) at {gpu.price_per_hour}/hour each",
            "include_deferred": True,
        }
        for name, gpu in sorted(config.slot_types.items())
    }


def pool_changes(current: dict[str, dict], wanted: dict[str, dict]) -> list[tuple[str, str, dict | None]]:
    """What makes Airflow's pools ``current`` match ``wanted`` (both as :func:`pools` shapes them):
    (pool, "create" | "update" | "delete" | "keep", the pool's wanted fields or None). Only trainyard's
    pools (``gpu-*``) are deleted; any other pool is not trainyard's to touch."""
    changes: list[tuple[str, str, dict | None]] = []
    for name, fields in wanted.items():
        have = current.get(name)
        if have is None:
            changes.append((name, "create", fields))
        elif any(have.get(k) != v for k, v in fields.items()):
            changes.append((name, "update", fields))
        else:
            changes.append((name, "keep", fields))
    for name in sorted(set(current) - set(wanted)):
        if name.startswith(POOL_PREFIX):
            changes.append((name, "delete", None))
    return changes


def unknown_team(team: str, config: ResourcesConfig, field: str = "resources.team") -> str:
    return f"{field}: unknown team {team!r}; allowed: {sorted(config.teams)}"


def mig_profile_problem(config: ResourcesConfig, gpu_type: str, profile: str | None) -> str | None:
    """Why a job of ``gpu_type`` may not ask for the MIG ``profile`` (None: no profile), or None if it may.
    A type with ``mig_profiles`` is partitioned: it offers only those slices, each profile counted apart
    (its pool, its quota, its devices, :attr:`ResourcesConfig.slot_types`), so a job names one; any other
    type offers whole GPUs (or CPU slots), and a profile there would ask for slices no host has."""
    offered = config.gpu_types[gpu_type].mig_profiles
    if offered and profile not in offered:
        got = f"got {profile!r}" if profile else "none was named"
        return (
            f"resources.mig_profile: GPU type {gpu_type!r} is partitioned with MIG and offers only its slices: "
            f"name one of {sorted(offered)} ({got})"
        )
    if profile and not offered:
        partitioned = sorted(t for t, g in config.gpu_types.items() if g.mig_profiles)
        return (
            f"resources.mig_profile: GPU type {gpu_type!r} is not partitioned with MIG (no mig_profiles in "
            f"resources.yaml), so it has no {profile!r} slices; leave mig_profile out, or choose a MIG type: "
            f"{partitioned}"
        )
    return None


def check_spec(spec: JobSpec, config: ResourcesConfig) -> None:
    """Refuse a job that could never be scheduled (Airflow never runs a task whose pool_slots exceed the
    pool's size: it would wait forever instead; a MIG profile its GPU type does not offer, or none on a MIG
    type, :func:`mig_profile_problem`), or that its team may not run: a GPU type the team has no quota of and may
    not borrow, more slots than its quota plus what it may borrow, a priority outside the team's range."""
    res = spec.resources
    if res.gpu_type not in config.gpu_types:
        raise SpecError(
            spec_error_message(
                [f"resources.gpu_type: unknown GPU type {res.gpu_type!r}; allowed: {sorted(config.gpu_types)}"]
            )
        )
    if res.team not in config.teams:
        raise SpecError(spec_error_message([unknown_team(res.team, config)]))
    on_kubernetes = spec.backends.launcher == "kubernetes"
    mig = mig_profile_problem(config, res.gpu_type, res.mig_profile)
    if mig:
        raise SpecError(spec_error_message([mig]))
    slots = res.slot_type
    size = config.slot_types[slots].slots
    if res.total_gpus > size:
        raise SpecError(
            spec_error_message(
                [
                    f"resources.gpus_per_node: the job needs {res.total_gpus} {slots} GPU(s) "
                    f"(nodes x gpus_per_node) but pool {pool_name(slots)!r} has only {size}"
                ]
            )
        )
    reach = max_reach(config, res.team, slots)
    if res.total_gpus > reach:
        raise SpecError(
            spec_error_message(
                [
                    f"resources.gpus_per_node: team {res.team!r} may hold at most {reach} {slots} slot(s) "
                    f"(quota {config.quota(res.team, slots)} plus what it may borrow), the job needs "
                    f"{res.total_gpus}; ask for fewer, another gpu_type, or a larger quota in resources.yaml"
                ]
            )
        )
    if config.scheduling.kueue and on_kubernetes:
        wanted = team_namespace(res.team)
        if spec.kubernetes.namespace != wanted:
            raise SpecError(
                spec_error_message(
                    [
                        f"kubernetes.namespace: team {res.team!r}'s trainings queue in Kueue from namespace "
                        f"{wanted!r} (its LocalQueue); got {spec.kubernetes.namespace!r}"
                    ]
                )
            )
    allowed = config.teams[res.team].priority
    if not allowed.min <= res.priority <= allowed.max:
        raise SpecError(
            spec_error_message(
                [
                    f"resources.priority: {res.priority} is outside team {res.team!r}'s range "
                    f"{allowed.min}..{allowed.max}"
                ]
            )
        )


def max_reach(config: ResourcesConfig, team: str, gpu_type: str) -> int:
    """The most slots of ``gpu_type`` ``team`` can ever hold at once: its quota plus what the others lend
    and the slots in no team's quota, capped by its borrowing limit."""
    lendable = sum(config.lending_limit(t, gpu_type) for t in config.teams if t != team) + unassigned(config, gpu_type)
    limit = config.borrowing_limit(team, gpu_type)
    borrow = lendable if limit is None else min(limit, lendable)
    return min(config.quota(team, gpu_type) + borrow, config.slot_types[gpu_type].slots)


def unassigned(config: ResourcesConfig, gpu_type: str) -> int:
    """The slots of ``gpu_type`` in no team's quota: any team may borrow them."""
    return config.slot_types[gpu_type].slots - sum(config.quota(t, gpu_type) for t in config.teams)


def run_cost(config: ResourcesConfig, gpu_type: str, gpu_seconds: float) -> float:
    """Cost of a run = price per GPU-hour x GPU-hours, where ``gpu_seconds`` sums hours x GPUs over every
    try (``trainyard.training.usage.gpu_seconds``)."""
    return config.slot_types[gpu_type].price_per_hour * gpu_seconds / 3600.0
