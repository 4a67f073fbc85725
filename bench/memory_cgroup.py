"""Run a command under a memory limit the kernel enforces: a memory cgroup (v2 ``memory.max``, or v1
``memory.limit_in_bytes``) made under this process's own, for the benchmarks and tests that show a
dataset larger than a process's allowed memory still trains. Needs root and a writable cgroup tree;
``available()`` says why not otherwise. A process over the limit is killed by the kernel's OOM killer
(exit -9), as a container over its memory limit would be.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _parent() -> tuple[Path, str]:
    """(this process's memory cgroup directory, "v1" or "v2")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return ROOT / "memory" / path.lstrip("/"), "v1"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            base = ROOT / "unified" if (ROOT / "unified" / "cgroup.controllers").exists() else ROOT
            return base / line[3:].lstrip("/"), "v2"
    raise OSError("no memory cgroup in /proc/self/cgroup")


def available() -> str | None:
    """None when a memory-limited child cgroup can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root to make a memory cgroup"
    try:
        parent, version = _parent()
    except OSError as err:
        return str(err)
    limit = "memory.limit_in_bytes" if version == "v1" else "memory.max"
    probe = parent / f"trainyard-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        ok = (probe / limit).exists()
        probe.rmdir()
    except OSError as err:
        return f"cannot make a cgroup under {parent}: {err}"
    return None if ok else f"{parent} has no {limit} (memory controller not enabled there)"


def run(argv: list[str], limit_mb: int, **kwargs) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``argv`` in a new cgroup limited to ``limit_mb``; (the finished process, the cgroup's peak
    usage in bytes, page cache included)."""
    parent, version = _parent()
    group = parent / f"trainyard-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        limit = str(limit_mb << 20)
        if version == "v1":
            (group / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit there
                (group / "memory.memsw.limit_in_bytes").write_text(limit)
        else:
            (group / "memory.max").write_text(limit)
            with contextlib.suppress(OSError):
                (group / "memory.swap.max").write_text("0")
        procs = str(group / "cgroup.procs")

        def enter() -> None:  # in the child, before exec: it and all it starts count against the limit
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        proc = subprocess.run(argv, preexec_fn=enter, check=False, **kwargs)  # noqa: PLW1509 - only writes a file
        peak_file = "memory.max_usage_in_bytes" if version == "v1" else "memory.peak"
        peak = int((group / peak_file).read_text()) if (group / peak_file).exists() else -1
        return proc, peak
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()
