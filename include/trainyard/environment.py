"""The resolved dependency set of this Python environment: what a run records so that it can be replayed
on the same libraries, and what a replay compares."""

from __future__ import annotations

import hashlib
import re
from importlib import metadata

DEPENDENCIES_TAG = "dependencies.sha256"
DEPENDENCIES_ARTIFACT = "environment/dependencies.txt"
# What the built-in trainer's own environment holds (rank 0 writes it into work/ as it starts; in a pod
# that is the image's, which the Airflow worker that planned the run cannot see): recorded by the collect
# step beside the worker's set
TRAINER_FILE = "trainer_dependencies.txt"
TRAINER_TAG = "trainer.dependencies.sha256"
TRAINER_ARTIFACT = "environment/trainer_dependencies.txt"
REQUIREMENT_LINE = re.compile(r"[a-z0-9][a-z0-9-]{0,99}==[^\s=]{1,100}")  # a line of installed()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as pip compares names


def installed() -> list[str]:
    """Every installed distribution as ``name==version`` (names normalised), sorted; one line each."""
    found = {}
    for dist in metadata.distributions():
        fields = dist.metadata  # each access (``.version`` too) reads and parses the METADATA file again
        if fields["Name"]:
            found[_normal(fields["Name"])] = fields["Version"]
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def differences(recorded: list[str], current: list[str]) -> list[str]:
    """What changed from ``recorded`` to ``current`` (``name==version`` lines), one line per package."""
    before = dict(line.split("==", 1) for line in recorded if "==" in line)
    after = dict(line.split("==", 1) for line in current if "==" in line)
    out = [f"{n}: {before[n]} -> {after[n]}" for n in sorted(before.keys() & after.keys()) if before[n] != after[n]]
    out += [f"{n}: {before[n]} -> not installed" for n in sorted(before.keys() - after.keys())]
    out += [f"{n}: not recorded -> {after[n]}" for n in sorted(after.keys() - before.keys())]
    return out
