"""Metric gates: compare metrics with thresholds; every check is reported, pass or fail."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from trainyard.errors import PermanentError
from trainyard.spec import Threshold


class GateFailed(PermanentError):
    """The model missed a threshold or lost to the champion; the message lists every breach."""


@dataclass(frozen=True)
class Check:
    metric: str
    value: float | None
    min: float | None
    max: float | None
    passed: bool
    margin: float | None  # distance to the nearest bound; negative = breached by that much

    def describe(self) -> str:
        if self.value is None:
            return f"{self.metric}: missing (no such metric was computed)"
        bounds = " and ".join(
            b
            for b in (
                f">= {self.min:g}" if self.min is not None else "",
                f"<= {self.max:g}" if self.max is not None else "",
            )
            if b
        )
        return f"{self.metric} = {self.value:.4f}, needs {bounds}: {self.verdict()}"

    def verdict(self) -> str:
        if self.passed:
            return "ok"
        assert self.margin is not None  # a value that misses its bound misses it by a margin
        return f"FAILED by {-self.margin:.4g}"


@dataclass(frozen=True)
class GateResult:
    passed: bool
    checks: tuple[Check, ...]

    @property
    def breaches(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def message(self) -> str:
        if self.passed:
            return "gate passed: " + "; ".join(c.describe() for c in self.checks)
        return "gate failed:\n  " + "\n  ".join(c.describe() for c in self.breaches)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "checks": [asdict(c) for c in self.checks]}


def evaluate_gate(metrics: dict[str, float], thresholds: Sequence[Threshold]) -> GateResult:
    """``thresholds``: the JobSpec's ``gates``."""
    checks = []
    for t in thresholds:
        name, lo, hi = t.metric, t.min, t.max
        value = metrics.get(name)
        if value is None:
            checks.append(Check(name, None, lo, hi, False, None))
            continue
        margins = [value - lo] if lo is not None else []
        margins += [hi - value] if hi is not None else []
        margin = min(margins)
        checks.append(Check(name, float(value), lo, hi, margin >= 0, margin))
    return GateResult(all(c.passed for c in checks), tuple(checks))
