"""What of its host one local training may use (CPU, memory, process count) and the cgroup that holds it there.

A job's limits come from its JobSpec and its team's policy (``ResourcesConfig.job_limits``, defaults in
``resources.yaml``): cpus = ``cpus_per_slot`` x its slots, memory = ``memory_gb_per_slot`` x its slots
(``resources.total_gpus``), processes = ``processes`` (threads count too). :func:`job_limits` computes them.

The local launcher enforces them with one cgroup per launch, ``trainyard/<name>`` in each controller's
hierarchy (cgroup v2, or the v1 hierarchy of a controller where the host mounts it so), created as root:
``memory.max`` (no swap; past it the kernel OOM-kills the group), ``pids.max`` (a fork past it fails) and
``cpu.max`` (a quota of ``cpus`` cores per period), or their v1 twins. The launch's entry
(:mod:`~trainyard.training.launchers.sandbox_entry`) moves itself into it before it execs anything of the
job, so every process of the job is in it. Once the workers have ended, :meth:`LaunchCgroup.breaches` reads
the kernel's counts (``memory.events`` oom_kill, ``pids.events`` max) and names the limit that stopped them
(:class:`LimitReached`). The cgroup is removed once its processes are gone; one a crashed launch left is
removed by the next launch that takes its name (a sandbox user's), or whose launching process is gone.

Where a controller cannot be had (the worker is not root; the host mounts no such controller, or will not
let one be enabled), :attr:`Enforcement.not_enforced` says which limit is not enforced and why, and the
launcher writes it to the task log; a sandboxed job's processes are then capped by its sandbox user's
RLIMIT_NPROC alone (RLIMIT_AS is not a memory limit: torch and CUDA reserve address space far beyond it).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.errors import PermanentError, RetryableError
from trainyard.scheduling.resources import ResourcesConfig
from trainyard.spec import JobSpec

PARENT = "trainyard"  # below each hierarchy's root: every launch's cgroup, and nothing else
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
GIB = 1 << 30
MOUNTS = Path("/proc/self/mounts")
REMOVE_WAIT_S = 10.0  # a cgroup's last processes are being reaped: the longest rmdir is tried again


class LimitReached(PermanentError):
    """The job's processes were stopped by one of its host limits: running it again stops it the same way."""


class CgroupError(RetryableError):
    """A launch's cgroup could not be removed (its processes are not gone)."""


@dataclass(frozen=True)
class HostLimits:
    """One job's limits, and where they come from (for the messages)."""

    cpus: float
    memory_bytes: int
    processes: int
    slots: int = 1
    cpus_per_slot: float = 0.0
    memory_gb_per_slot: float = 0.0
    source: str = "limits"  # the resources.yaml key they are set at: limits, or teams.<team>.policy.limits

    def describe(self, controller: str) -> str:
        """The limit of ``controller`` as a person reads it, with how it was computed."""
        slots = f"{self.slots} slot{'s' if self.slots != 1 else ''}"
        if controller == "memory":
            per = f"{self.source}.memory_gb_per_slot {self.memory_gb_per_slot:g} x {slots}"
            return f"memory limit {self.memory_bytes / GIB:.3g} GiB ({per})"
        if controller == "cpu":
            return f"CPU limit {self.cpus:g} cores ({self.source}.cpus_per_slot {self.cpus_per_slot:g} x {slots})"
        return f"process limit {self.processes} ({self.source}.processes)"

    @property
    def raise_it(self) -> str:
        return f"raise it in resources.yaml {self.source}" + (
            "" if self.source != "limits" else " or the team's policy.limits"
        )


def job_limits(spec: JobSpec, resources: ResourcesConfig) -> HostLimits:
    """``spec``'s limits under ``resources`` (its team's policy's, else the file's)."""
    team = spec.resources.team
    per = resources.job_limits(team)
    source = f"teams.{team}.policy.limits" if resources.teams[team].policy.limits else "limits"
    slots = spec.resources.total_gpus
    return HostLimits(
        cpus=per.cpus_per_slot * slots,
        memory_bytes=int(per.memory_gb_per_slot * slots * GIB),
        processes=per.processes,
        slots=slots,
        cpus_per_slot=per.cpus_per_slot,
        memory_gb_per_slot=per.memory_gb_per_slot,
        source=source,
    )


def hierarchies() -> dict[str, tuple[Path, int]]:
    """Controller -> (the root of its hierarchy, cgroup version) for each of :data:`CONTROLLERS` this host
    mounts (v2 where a controller is in both)."""
    found: dict[str, tuple[Path, int]] = {}
    for line in MOUNTS.read_text().splitlines():
        _, mount, fstype, options = line.split()[:4]
        if fstype == "cgroup2":
            with contextlib.suppress(OSError):
                for c in (Path(mount) / "cgroup.controllers").read_text().split():
                    if c in CONTROLLERS:
                        found[c] = (Path(mount), 2)
    for line in MOUNTS.read_text().splitlines():
        _, mount, fstype, options = line.split()[:4]
        for c in options.split(",") if fstype == "cgroup" else ():
            if c in CONTROLLERS:
                found.setdefault(c, (Path(mount), 1))
    return found


def _write(path: Path, value: str | int) -> None:
    path.write_text(str(value))


def _settings(controller: str, version: int, limits: HostLimits) -> list[tuple[str, str, bool]]:
    """(file, value, required) to write, in order."""
    memory, quota = str(limits.memory_bytes), str(max(1000, round(limits.cpus * CPU_PERIOD_US)))
    table: dict[tuple[str, int], list[tuple[str, str, bool]]] = {
        ("memory", 2): [("memory.max", memory, True), ("memory.swap.max", "0", False), ("memory.oom.group", "1", True)],
        # v1: the OOM killer kills the group's largest process, not the whole group (no memory.oom.group)
        ("memory", 1): [("memory.limit_in_bytes", memory, True), ("memory.memsw.limit_in_bytes", memory, False)],
        ("pids", 2): [("pids.max", str(limits.processes), True)],
        ("pids", 1): [("pids.max", str(limits.processes), True)],
        ("cpu", 2): [("cpu.max", f"{quota} {CPU_PERIOD_US}", True)],
        ("cpu", 1): [("cpu.cfs_period_us", str(CPU_PERIOD_US), True), ("cpu.cfs_quota_us", quota, True)],
    }
    return table[(controller, version)]


def _make(root: Path, version: int, controller: str, name: str) -> None:
    parent = root / PARENT
    parent.mkdir(mode=0o755, exist_ok=True)
    if version == 2:  # a v2 controller reaches a cgroup only where every cgroup above enables it
        for d in (root, parent):
            if controller not in (d / "cgroup.subtree_control").read_text().split():
                _write(d / "cgroup.subtree_control", f"+{controller}")
    (parent / name).mkdir(mode=0o755, exist_ok=True)


@dataclass(frozen=True)
class LaunchCgroup:
    """One launch's cgroup: its directory in each controller's hierarchy."""

    name: str
    dirs: dict[str, tuple[Path, int]]  # controller -> (its directory, cgroup version)

    @property
    def procs_files(self) -> list[str]:
        """Where the entry writes its pid: each distinct directory's ``cgroup.procs``."""
        return [str(d / "cgroup.procs") for d in dict.fromkeys(d for d, _ in self.dirs.values())]

    def read(self, controller: str, name: str) -> str:
        return (self.dirs[controller][0] / name).read_text()

    def counts(self) -> dict[str, int]:
        """How often each limit stopped something: processes OOM-killed, forks refused."""
        found = {}
        if "memory" in self.dirs:
            events = "memory.events" if self.dirs["memory"][1] == 2 else "memory.oom_control"
            found["memory"] = _field(self.read("memory", events), "oom_kill")
        if "pids" in self.dirs:
            found["pids"] = _field(self.read("pids", "pids.events"), "max")
        return found

    def breaches(self, limits: HostLimits) -> LimitReached | None:
        """The error naming every limit that stopped something, or None."""
        counts = self.counts()
        said = []
        if counts.get("memory"):
            said.append(
                f"the job's processes were killed: {limits.describe('memory')} reached "
                f"({counts['memory']} OOM kill(s)); {limits.raise_it}, or use less memory"
            )
        if counts.get("pids"):
            said.append(
                f"fork refused {counts['pids']} times: {limits.describe('pids')} reached; {limits.raise_it}, "
                "or start fewer processes and threads"
            )
        return LimitReached("; ".join(said)) if said else None

    def remove(self) -> None:
        """Remove every directory once the kernel has let go of its processes."""
        remove(self.name, [d for d, _ in self.dirs.values()])


def _field(text: str, key: str) -> int:
    found = re.search(rf"^{re.escape(key)} ([0-9]+)$", text, re.MULTILINE)
    return int(found[1]) if found else 0


def remove(name: str, dirs: list[Path] | None = None) -> None:
    """Remove launch ``name``'s cgroup wherever it is (``dirs``: those); CgroupError if processes stay in it."""
    if dirs is None:
        try:
            dirs = [root / PARENT / name for root, _ in hierarchies().values()]
        except OSError:
            return
    deadline = time.monotonic() + REMOVE_WAIT_S
    for d in dict.fromkeys(dirs):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as err:  # EBUSY: its last processes are still exiting
                if time.monotonic() > deadline:
                    raise CgroupError(f"cgroup {d} still holds processes: {err}") from err
                time.sleep(0.05)


def remove_leftovers(prefix: str) -> None:
    """Remove the cgroups named ``<prefix><pid>-...`` whose launching process ``pid`` is gone (crashed)."""
    with contextlib.suppress(OSError):
        for root, _ in hierarchies().values():
            for d in (root / PARENT).glob(f"{prefix}*"):
                found = re.fullmatch(re.escape(prefix) + r"([0-9]+)-.*", d.name)
                if found and not Path(f"/proc/{found[1]}").exists():
                    with contextlib.suppress(OSError):
                        d.rmdir()  # busy: its processes live on; the next launch tries again


@dataclass(frozen=True)
class Enforcement:
    """What holds one launch's limits: its cgroup (if any), and each limit not enforced, with why."""

    limits: HostLimits
    cgroup: LaunchCgroup | None = None
    not_enforced: dict[str, str] = field(default_factory=dict)  # controller -> why

    @property
    def counts_processes(self) -> bool:
        return self.cgroup is not None and "pids" in self.cgroup.dirs

    def log_lines(self, fallback: str = "") -> list[str]:
        """What the task log says: the limits in force, and each one not enforced with why (never silently)."""
        enforced = [c for c in CONTROLLERS if c not in self.not_enforced]
        lines = []
        if enforced and self.cgroup is not None:
            versions = sorted({f"v{v}" for _, v in self.cgroup.dirs.values()})
            held = ", ".join(self.limits.describe(c) for c in enforced)
            lines.append(f"limits: {held}; enforced by cgroup {'/'.join(versions)} {PARENT}/{self.cgroup.name}")
        for c, why in self.not_enforced.items():
            extra = fallback if c == "pids" and fallback else ""
            lines.append(f"limits: NOT ENFORCED: {self.limits.describe(c)}: {why}{extra}")
        return lines


def create(name: str, limits: HostLimits) -> Enforcement:
    """Launch ``name``'s cgroup with ``limits`` written (as root), or what could not be had and why."""
    if os.geteuid() != 0:
        why = "the worker does not run as root, so it cannot create a cgroup for the job"
        return Enforcement(limits, None, dict.fromkeys(CONTROLLERS, why))
    try:
        found = hierarchies()
    except OSError as err:
        return Enforcement(limits, None, dict.fromkeys(CONTROLLERS, f"cannot read {MOUNTS}: {err}"))
    absent = "this host mounts no {} cgroup controller (neither cgroup v2 nor v1)"
    not_enforced = {c: absent.format(c) for c in CONTROLLERS if c not in found}
    dirs: dict[str, tuple[Path, int]] = {}
    for controller, (root, version) in found.items():
        here = root / PARENT / name
        try:
            _make(root, version, controller, name)
            for file, value, required in _settings(controller, version, limits):
                if required or (here / file).exists():
                    _write(here / file, value)
            dirs[controller] = (here, version)
        except OSError as err:
            not_enforced[controller] = f"cgroup v{version} {here} cannot be set up: {err}"
            if here not in (d for d, _ in dirs.values()):  # a v2 directory serves the controllers set up before
                with contextlib.suppress(OSError):
                    here.rmdir()
    return Enforcement(limits, LaunchCgroup(name, dirs) if dirs else None, not_enforced)
