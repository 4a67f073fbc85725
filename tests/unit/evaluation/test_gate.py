import pytest

from trainyard.evaluation.gate import evaluate_gate
from trainyard.spec import Threshold


def gates(*raw: dict) -> list[Threshold]:
    return [Threshold.model_validate(r) for r in raw]


@pytest.mark.parametrize(
    "name, metrics, thresholds, passed, breached",
    [
        ("min met", {"acc": 0.95}, [{"metric": "acc", "min": 0.9}], True, []),
        ("min exactly", {"acc": 0.9}, [{"metric": "acc", "min": 0.9}], True, []),
        ("min missed", {"acc": 0.85}, [{"metric": "acc", "min": 0.9}], False, ["acc"]),
        ("max missed", {"loss": 0.7}, [{"metric": "loss", "max": 0.5}], False, ["loss"]),
        ("band", {"x": 5.0}, [{"metric": "x", "min": 1, "max": 10}], True, []),
        ("missing metric", {}, [{"metric": "acc", "min": 0.9}], False, ["acc"]),
        (
            "all breaches listed",
            {"acc": 0.5, "loss": 2.0, "f1": 0.99},
            [{"metric": "acc", "min": 0.9}, {"metric": "loss", "max": 1.0}, {"metric": "f1", "min": 0.5}],
            False,
            ["acc", "loss"],
        ),
    ],
)
def test_gate(name, metrics, thresholds, passed, breached):
    result = evaluate_gate(metrics, gates(*thresholds))
    assert result.passed is passed, name
    assert [c.metric for c in result.breaches] == breached


def test_message_says_by_how_much():
    result = evaluate_gate({"acc": 0.85}, gates({"metric": "acc", "min": 0.9}))
    assert "acc = 0.8500, needs >= 0.9: FAILED by 0.05" in result.message()
    assert result.to_dict()["checks"][0]["margin"] == pytest.approx(-0.05)
