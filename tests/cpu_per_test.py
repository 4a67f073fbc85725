"""An opt-in pytest plugin: each test's CPU time with every process it started, the services its module's
fixtures started included (an Airflow, PostgreSQL, the training workers): what shortens a CPU-bound suite.

    TEST_CPU_DIR=var/test-cpu make test                          # tests/conftest.py registers it
    TEST_CPU_DIR=var/test-cpu .venv/bin/python tests/cpu_per_test.py  # sums by test file, costliest first

Each pytest process (an xdist worker) moves itself into a cgroup v1 ``cpuacct`` group of its own, which the
processes it starts inherit, and reads ``cpuacct.usage`` before and after each test: a row of test id, wall
seconds and CPU seconds in ``<worker>.tsv``. It needs a writable ``cpuacct`` hierarchy (root on a host
that mounts cgroup v1 controllers); elsewhere it warns once and measures nothing.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("TEST_CPU_DIR", "var/test-cpu"))
_group: Path | None = None


def _usage() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _group
    group = CPUACCT / f"trainyard-test-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        warnings.warn(f"cpu_per_test measures nothing: no cpuacct group of its own here ({err})", stacklevel=1)
        return
    _group = group
    OUT.mkdir(parents=True, exist_ok=True)


def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        return None
    cpu, wall = _usage(), time.monotonic()
    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    runtestprotocol(item, nextitem=nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(OUT / f"{worker}.tsv", "a") as fh:
        fh.write(f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{_usage() - cpu:.2f}\n")
    return True


def main() -> None:
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for tsv in sorted(OUT.glob("*.tsv")):
        for line in tsv.read_text().splitlines():
            test, held, used = line.split("\t")
            cpu[test.split("::")[0]] += float(used)
            wall[test.split("::")[0]] += float(held)
    if not cpu:
        sys.exit(f"no rows in {OUT}: run the suite with -p cpu_per_test first")
    print(f"{'CPU s':>8} {'wall s':>8}  file")
    for name in sorted(cpu, key=cpu.__getitem__, reverse=True):
        print(f"{cpu[name]:8.1f} {wall[name]:8.1f}  {name}")
    print(f"{sum(cpu.values()):8.1f} {sum(wall.values()):8.1f}  in all")


if __name__ == "__main__":
    main()
