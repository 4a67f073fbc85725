"""A registered model belongs to the team that first registered it, against a real MLflow (SQLite store)."""

import multiprocessing

import pytest

from trainyard.errors import PermanentError
from trainyard.registry import ownership
from trainyard.teams import NotAllowed


@pytest.fixture
def client(trainyard_home):
    from trainyard.tracking import mlflow_tracking as mt

    return mt.client()


def test_the_first_team_to_register_a_name_owns_it(client):
    assert ownership.owner(client, "digits") is None
    assert ownership.claim(client, "digits", "vision") == "vision"
    assert ownership.claim(client, "digits", "nlp") == "vision"  # found, not taken over
    assert client.get_registered_model("digits").tags[ownership.OWNER_TAG] == "vision"


def test_a_model_from_before_owners_is_its_first_versions_team(client):
    client.create_registered_model("legacy")  # as trainyard made them before it recorded owners
    for team in ("nlp", "vision"):
        client.create_model_version("legacy", source="file:///nowhere", tags={ownership.VERSION_TEAM_TAG: team})
    assert ownership.owner(client, "legacy") == "nlp"
    assert ownership.OWNER_TAG not in client.get_registered_model("legacy").tags  # a look writes nothing
    assert ownership.claim(client, "legacy", "vision") == "nlp"  # a registration records it
    assert client.get_registered_model("legacy").tags[ownership.OWNER_TAG] == "nlp"
    client.create_registered_model("foreign")  # made outside trainyard: nothing to go by
    with pytest.raises(ownership.NoOwner, match="trainyard models owner foreign TEAM"):
        ownership.owner(client, "foreign")
    assert ownership.set_owner(client, "foreign", "nlp") is None
    with pytest.raises(PermanentError, match="belongs to team 'nlp'; pass --replace"):
        ownership.set_owner(client, "foreign", "vision")
    assert ownership.set_owner(client, "foreign", "vision", replace=True) == "nlp"


def _claim(args):
    home, team, barrier = args
    import os

    os.environ["TRAINYARD_HOME"] = home
    from trainyard.tracking import mlflow_tracking as mt

    barrier.wait()
    return team, ownership.claim(mt.client(), "contested", team)


def test_teams_registering_one_name_at_once_agree_on_one_owner(client, trainyard_home):
    teams = ["vision", "nlp", "research", "default"]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(teams))
        with ctx.Pool(len(teams)) as pool:
            said = pool.map(_claim, [(str(trainyard_home), t, barrier) for t in teams])
    owners = {owner for _, owner in said}
    assert len(owners) == 1 and owners <= set(teams), said
    assert ownership.owner(client, "contested") == owners.pop()


def test_a_job_of_another_team_is_refused_before_any_data_moves_and_at_register(client):
    from trainyard.pipeline import check_ownership
    from trainyard.spec import parse_spec

    ownership.claim(client, "digits", "vision")
    theirs = parse_spec({"name": "digits", "resources": {"team": "default"}})
    with pytest.raises(NotAllowed, match="model 'digits' belongs to team 'vision'"):
        check_ownership(theirs, client)
    with pytest.raises(NotAllowed, match="belongs to team 'vision'"):
        check_ownership(theirs, client, claim=True)
    check_ownership(parse_spec({"name": "digits", "resources": {"team": "vision"}}), client)
    check_ownership(parse_spec({"name": "digits", "resources": {"team": "default"}, "replay_of": "digits:1"}), client)
    check_ownership(parse_spec({"name": "fresh", "resources": {"team": "default"}}), client)  # nobody's yet
    assert ownership.owner(client, "fresh") is None  # the first task only looks; register claims
