import json

import pytest
from pydantic import ValidationError

from trainyard.evaluation.champion import ChampionCheck, champion_check, combined_gate, message
from trainyard.evaluation.gate import Check
from trainyard.spec import ChampionRule, Threshold

UP = {"metric": "map", "margin": 0.01, "higher_is_better": True}
DOWN = {"metric": "loss", "margin": 0.05, "higher_is_better": False}


def rules(*raw: dict) -> list[ChampionRule]:
    """Rules as the JobSpec holds them (validated where the spec enters)."""
    return [ChampionRule.model_validate(r) for r in raw]


@pytest.mark.parametrize(
    "name, challenger, champion, raw, passed",
    [
        ("beats by more than the margin", {"map": 0.95}, {"map": 0.90}, [UP], [True]),
        ("better but within the margin", {"map": 0.905}, {"map": 0.90}, [UP], [False]),
        ("worse", {"map": 0.80}, {"map": 0.90}, [UP], [False]),
        ("margin exact (binary-exact numbers)", {"map": 0.75}, {"map": 0.5}, [{**UP, "margin": 0.25}], [True]),
        ("margin exact despite float error (0.9 + 0.01)", {"map": 0.91}, {"map": 0.90}, [UP], [True]),
        ("margin exact despite float error (0.7 + 0.1)", {"map": 0.8}, {"map": 0.7}, [{**UP, "margin": 0.1}], [True]),
        ("just under the margin", {"map": 0.9099}, {"map": 0.90}, [UP], [False]),
        ("zero margin: a tie passes", {"map": 0.9}, {"map": 0.9}, [{**UP, "margin": 0}], [True]),
        ("no margin key means zero", {"map": 0.9}, {"map": 0.9}, [{"metric": "map", "higher_is_better": True}], [True]),
        ("lower is better: lower by the margin", {"loss": 0.30}, {"loss": 0.35}, [DOWN], [True]),
        ("lower is better: lower but within the margin", {"loss": 0.33}, {"loss": 0.35}, [DOWN], [False]),
        ("lower is better: higher fails", {"loss": 0.40}, {"loss": 0.35}, [DOWN], [False]),
        ("first model passes", {"map": 0.1, "loss": 9.0}, None, [UP, DOWN], [True, True]),
        ("first model still needs the metric", {}, None, [UP], [False]),
        ("challenger lacks the metric", {}, {"map": 0.9}, [UP], [False]),
        ("champion lacks the metric", {"map": 0.99}, {}, [UP], [False]),
        ("every rule reported", {"map": 0.95, "loss": 0.34}, {"map": 0.90, "loss": 0.35}, [UP, DOWN], [True, False]),
    ],
)
def test_champion_check(name, challenger, champion, raw, passed):
    rows = champion_check(challenger, champion, rules(*raw))
    assert [r.passed for r in rows] == passed, name
    assert [r.metric for r in rows] == [r["metric"] for r in raw]
    assert all(isinstance(r, Check) for r in rows)  # rows are gate rows, extended


def test_row_carries_bound_and_slack():
    (row,) = champion_check({"map": 0.905}, {"map": 0.90}, rules(UP))
    assert (row.champion, row.required_margin, row.min, row.max) == (0.90, 0.01, pytest.approx(0.91), None)
    assert row.margin == pytest.approx(-0.005)
    assert (
        row.describe() == "map = 0.9050 vs champion 0.9000, needs >= 0.9100 (champion + margin 0.01): FAILED by 0.005"
    )
    (row,) = champion_check({"loss": 0.30}, {"loss": 0.35}, rules(DOWN))
    assert (row.min, row.max, row.margin) == (None, pytest.approx(0.30), pytest.approx(0.0, abs=1e-12))
    assert "needs <= 0.3000 (champion - margin 0.05): ok" in row.describe()


def test_first_model_note():
    (row,) = champion_check({"map": 0.4}, None, rules(UP))
    assert row.passed and row.champion is None and row.margin is None
    assert row.describe() == "map = 0.4000: no champion yet: first model passes"


@pytest.mark.parametrize(
    "name, rule, error",
    [
        ("negative margin", {**UP, "margin": -0.1}, "margin\n.*greater than or equal to 0"),
        ("nan margin", {**UP, "margin": float("nan")}, "margin\n.*finite number"),
        ("direction as text", {**UP, "higher_is_better": "yes"}, "higher_is_better\n.*valid boolean"),
        ("typo key", {**UP, "higher_better": True}, "higher_better\n.*Extra inputs are not permitted"),
        ("no metric", {"margin": 0.1, "higher_is_better": True}, "metric\n.*Field required"),
    ],
)
def test_bad_rules_are_refused_where_the_spec_enters(name, rule, error):
    with pytest.raises(ValidationError, match=error):
        ChampionRule.model_validate(rule)


def test_direction_defaults_to_higher_is_better():
    """Decided, not guessed: every metric the built-in recipes report grows with quality, so the spec's
    default is true (its description says so); a loss rule must say false."""
    (rule,) = rules({"metric": "map", "margin": 0.1})
    assert rule.higher_is_better is True
    assert "set false for a loss" in ChampionRule.model_fields["higher_is_better"].description
    (row,) = champion_check({"map": 0.95}, {"map": 0.9}, [rule])
    assert not row.passed and row.min == pytest.approx(1.0)


THRESHOLDS = [Threshold(metric="map", min=0.5), Threshold(metric="loss", max=1.0)]


@pytest.mark.parametrize(
    "name, metrics, champion, passed, breached",
    [
        ("all pass", {"map": 0.95, "loss": 0.2}, {"map": 0.9, "loss": 0.3}, True, []),
        ("first model, thresholds met", {"map": 0.6, "loss": 0.9}, None, True, []),
        ("first model, threshold missed", {"map": 0.4, "loss": 0.9}, None, False, [("threshold", "map")]),
        (
            "thresholds met, champion not beaten",
            {"map": 0.6, "loss": 0.9},
            {"map": 0.9, "loss": 0.3},
            False,
            [("champion", "map"), ("champion", "loss")],
        ),
        (
            "both kinds breached",
            {"map": 0.4, "loss": 0.2},
            {"map": 0.9, "loss": 0.3},
            False,
            [("threshold", "map"), ("champion", "map")],
        ),
    ],
)
def test_combined_gate(name, metrics, champion, passed, breached):
    result = combined_gate(metrics, THRESHOLDS, champion, rules(UP, DOWN))
    assert result == json.loads(json.dumps(result))  # JSON-able, for XCom
    assert result["passed"] is passed, name
    assert [(r["kind"], r["metric"]) for r in result["checks"]] == [
        ("threshold", "map"),
        ("threshold", "loss"),
        ("champion", "map"),
        ("champion", "loss"),
    ]
    assert [(r["kind"], r["metric"]) for r in result["checks"] if not r["passed"]] == breached
    assert message(result) == result["message"]  # renders the same when read back from XCom


def test_message_lists_every_breach():
    result = combined_gate({"map": 0.4, "loss": 1.5}, THRESHOLDS, {"map": 0.9, "loss": 0.3}, rules(UP, DOWN))
    assert result["message"].splitlines() == [
        "gate failed:",
        "  map = 0.4000, needs >= 0.5: FAILED by 0.1",
        "  loss = 1.5000, needs <= 1: FAILED by 0.5",
        "  map = 0.4000 vs champion 0.9000, needs >= 0.9100 (champion + margin 0.01): FAILED by 0.51",
        "  loss = 1.5000 vs champion 0.3000, needs <= 0.2500 (champion - margin 0.05): FAILED by 1.25",
    ]


def test_rows_have_threshold_and_champion_fields():
    result = combined_gate({"map": 0.95}, [Threshold(metric="map", min=0.5)], {"map": 0.9}, rules(UP))
    threshold, duel = result["checks"]
    assert threshold == {
        "kind": "threshold",
        "metric": "map",
        "value": 0.95,
        "min": 0.5,
        "max": None,
        "passed": True,
        "margin": pytest.approx(0.45),
    }
    assert duel["champion"] == 0.9 and duel["required_margin"] == 0.01 and duel["higher_is_better"] is True
    assert duel["min"] == pytest.approx(0.91) and duel["margin"] == pytest.approx(0.04)
    assert isinstance(ChampionCheck(**{k: v for k, v in duel.items() if k != "kind"}), Check)
