"""resources.yaml: the shipped file is a valid mixed fleet, and a file that cannot describe a real fleet is
refused with the line at fault."""

import textwrap

import pytest

from trainyard.scheduling.resources import ResourcesError, load_resources, max_reach, parse_resources, pools, unassigned
from trainyard.spec import SpecError, parse_spec

FLEET = """\
gpu_types:
  a100:
    count: 8
    price_per_hour: 1.5
  h100:
    count: 4
    price_per_hour: 3.0
    time_slicing: {replicas: 2}
teams:
  vision:
    quota: {a100: 4, h100: 4}
    priority: {min: 1, max: 900}
  nlp:
    quota: {a100: 2, h100: 2}
    lending_limit: {a100: 1}
    borrowing_limit: {h100: 1}
"""


def _refused(text: str) -> str:
    with pytest.raises(ResourcesError) as err:
        parse_resources(textwrap.dedent(text), "fleet.yaml")
    return str(err.value)


def test_the_shipped_file_is_a_mixed_fleet_with_teams():
    cfg = load_resources()
    assert {"cpu", "v100-16gb", "a100-80gb", "h100-80gb"} <= set(cfg.gpu_types)
    assert len(cfg.teams) >= 3
    assert cfg.gpu_types["v100-16gb"].slots == 2 * cfg.gpu_types["v100-16gb"].count  # time-sliced shares
    assert pools(cfg)["gpu-v100-16gb"]["slots"] == cfg.gpu_types["v100-16gb"].slots
    assert all(p["include_deferred"] for p in pools(cfg).values())


def test_quotas_borrowing_and_lending_limits():
    cfg = parse_resources(FLEET)
    assert cfg.gpu_types["h100"].slots == 8
    assert unassigned(cfg, "a100") == 2 and unassigned(cfg, "h100") == 2
    # vision: its 4 + nlp's lending limit 1 + the 2 in nobody's quota
    assert max_reach(cfg, "vision", "a100") == 7
    # nlp may borrow at most 1 h100 share beyond its 2
    assert max_reach(cfg, "nlp", "h100") == 3
    assert cfg.priority_class(500) == "normal" and cfg.priority_class(50) == "low" and cfg.priority_class(950) == "high"


@pytest.mark.parametrize(
    "change, line, message",
    [
        (
            ("nlp:\n    quota: {a100: 2,", "nlp:\n    quota: {a100: 5,"),
            14,
            "quotas over-commit a100: vision 4 + nlp 5 = 9",
        ),
        (("quota: {a100: 4, h100: 4}", "quota: {a100: 4, tpu: 4}"), 11, "unknown GPU type 'tpu'"),
        (("quota: {a100: 4, h100: 4}", "quota: {a100: -1, h100: 4}"), 11, "a number of slots is at least 0"),
        (("lending_limit: {a100: 1}", "lending_limit: {a100: 3}"), 15, "lends 3 slots of a quota of 2"),
        (("borrowing_limit: {h100: 1}", "borrowing_limit: {h100: 7}"), 16, "7 slots beyond a quota of 2"),
        (("priority: {min: 1, max: 900}", "priority: {min: 901, max: 900}"), 12, "min 901 is above max 900"),
        (("    count: 8\n", "    count: 0\n"), 3, "greater than or equal to 1"),
        (("time_slicing: {replicas: 2}", "time_slicing: {replicas: 2}\n    mig_profiles: {1g.10gb: 7}"), 9, "not both"),
        (("    price_per_hour: 1.5\n", "    price_per_hour: 1.5\n    mig_profiles: {3g.40gb: 3}\n"), 5, "9 compute"),
        (("    price_per_hour: 1.5\n", "    price_per_hour: 1.5\n    gpus: 3\n"), 5, "Extra inputs are not permitted"),
    ],
)
def test_a_file_that_cannot_be_a_fleet_is_refused_with_the_line(change, line, message):
    old, new = change
    assert old in FLEET
    text = _refused(FLEET.replace(old, new, 1))
    assert f"fleet.yaml:{line}:" in text and message in text, text


def test_every_fault_is_listed_at_once():
    text = _refused(
        FLEET.replace("{a100: 4, h100: 4}", "{a100: 4, tpu: 4}").replace(
            "lending_limit: {a100: 1}", "lending_limit: {a100: 3}"
        )
    )
    assert len(text.splitlines()) == 2


def test_a_job_is_held_to_its_team_s_reach_and_priority_range(tmp_path, monkeypatch):
    from trainyard.scheduling.resources import check_spec

    cfg = parse_resources(FLEET)
    ok = parse_spec({"resources": {"gpu_type": "a100", "gpus_per_node": 7, "team": "vision", "priority": 900}})
    check_spec(ok, cfg)
    with pytest.raises(SpecError, match="team 'vision' may hold at most 7 a100 slot"):
        check_spec(parse_spec({"resources": {"gpu_type": "a100", "gpus_per_node": 8, "team": "vision"}}), cfg)
    with pytest.raises(SpecError, match="resources.priority: 950 is outside team 'vision'"):
        check_spec(
            parse_spec({"resources": {"gpu_type": "a100", "gpus_per_node": 1, "team": "vision", "priority": 950}}), cfg
        )
