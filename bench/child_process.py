"""A benchmark's measurement in a fresh process: the benchmarks that must not share a process's state
(imports already done, caches, torch's thread pool) run a child of themselves and read what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any


def child_result(argv: list[str], env: Mapping[str, str] | None = None) -> Any:
    """Run ``python argv`` and return the JSON of its last line on stdout; a SystemExit with the end of its
    stderr when it fails."""
    command = [sys.executable, *argv]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
