"""A benchmark's measurement in a fresh process: the benchmarks that must not share a process's state
(imports already done, caches, torch's thread pool) run a child of themselves and read what it measured;
those that time a fault through a test of the suite run that test and read the lines it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def child_result(argv: list[str], env: Mapping[str, str] | None = None) -> Any:
    """Run ``python argv`` and return the JSON of its last line on stdout; a SystemExit with the end of its
    stderr when it fails."""
    command = [sys.executable, *argv]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figures_of_test(
    test: str, keyword: str, is_figure: Callable[[str], bool], count: int, env: Mapping[str, str] | None = None
) -> list[str]:
    """The ``count`` lines of stdout that ``is_figure`` picks, printed by the tests of file ``test`` (relative
    to the checkout) that ``-k keyword`` selects, run with ``pytest -s``; a SystemExit with the end of pytest's
    output when they fail or print another number of such lines."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", test, "-k", keyword]
    checkout = Path(__file__).resolve().parents[1]
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    figures = [line for line in done.stdout.splitlines() if is_figure(line)]
    if done.returncode or len(figures) != count:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout[-4000:]}")
    return figures
