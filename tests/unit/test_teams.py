"""Team policy: who may run, register, move an alias and approve a move (trainyard.teams), table-driven."""

import pytest

from trainyard import teams
from trainyard.scheduling.resources import parse_resources
from trainyard.teams import NotAllowed

FLEET = parse_resources("""\
gpu_types:
  cpu: {count: 2, price_per_hour: 0.0}
teams:
  vision:
    members: [ann, vic, val]
    policy: {promoters: [ann, vic]}
  nlp:
    members: [bob, ann]
  open:
    members: ["*"]
    policy: {approval: []}
""")
ADMIN = True


@pytest.mark.parametrize(
    "team, user, member, promoter",
    [
        ("vision", "ann", True, True),
        ("vision", "val", True, False),  # a member, not a promoter
        ("vision", "bob", False, False),
        ("nlp", "bob", True, True),  # no promoters listed: every member
        ("open", "anyone", True, True),
        ("gone", "ann", False, False),  # a team the file does not list has no members (it was open to all)
    ],
)
def test_who_belongs_and_who_may_promote(team, user, member, promoter):
    assert teams.is_member(FLEET, team, user) is member
    assert teams.may_promote(FLEET, team, user) is promoter


@pytest.mark.parametrize(
    "owner, user, admin, refused",
    [
        ("vision", "ann", False, None),
        ("vision", "val", False, "whose promoters are ann, vic"),
        ("vision", "bob", False, "it belongs to team 'vision'"),
        ("vision", "bob", ADMIN, None),
        ("vision", None, ADMIN, "at a person's request"),
        ("gone", "ann", False, "no longer lists: only an Airflow admin"),
        ("gone", "root", ADMIN, None),
    ],
)
def test_an_alias_moves_for_the_owning_teams_promoters_and_admins_only(owner, user, admin, refused):
    if refused is None:
        teams.check_alias_move(FLEET, "m", owner, user, admin=admin)
    else:
        with pytest.raises(NotAllowed, match=refused):
            teams.check_alias_move(FLEET, "m", owner, user, admin=admin)


def test_approval_is_the_owning_teams_policy_production_by_default():
    assert teams.needs_approval(FLEET, "vision", "production") is True
    assert teams.needs_approval(FLEET, "vision", "staging") is False
    assert teams.needs_approval(FLEET, "open", "production") is False  # its policy says so
    assert teams.needs_approval(FLEET, "gone", "staging") is True  # a team gone from the file: always


@pytest.mark.parametrize(
    "owner, requester, admins, expected",
    [
        ("vision", "ann", ["root"], ["root", "vic"]),  # promoters and admins, never the requester
        ("vision", "root", ["root"], ["ann", "vic"]),
        ("nlp", "bob", [], ["ann"]),  # members when no promoters are listed
        ("nlp", "bob", ["bob"], ["ann"]),
        ("open", "x", ["root"], None),  # everyone may: checked when the move is made
        ("gone", "x", ["root"], ["root"]),
    ],
)
def test_approvers_are_named_without_the_requester(owner, requester, admins, expected):
    assert teams.approvers(FLEET, owner, requester, admins) == expected


@pytest.mark.parametrize(
    "approver, admin, refused",
    [
        ("vic", False, None),
        ("root", ADMIN, None),
        ("ann", False, "approved their own move"),
        ("ann", ADMIN, "approved their own move"),  # an admin's own request too
        ("val", False, "may not approve"),  # a member, not a promoter
        ("bob", False, "may not approve"),
        (None, False, "none was recorded"),
    ],
)
def test_an_approval_is_another_promoters_or_an_admins(approver, admin, refused):
    if refused is None:
        teams.check_approval(FLEET, "m", "vision", "ann", approver, admin=admin)
    else:
        with pytest.raises(NotAllowed, match=refused):
            teams.check_approval(FLEET, "m", "vision", "ann", approver, admin=admin)


def test_a_model_takes_versions_from_its_owning_team_only():
    teams.check_owner("m", None, "nlp")  # nobody owns it yet: nlp will
    teams.check_owner("m", "nlp", "nlp")
    with pytest.raises(NotAllowed, match="model 'm' belongs to team 'vision'; a job of team 'nlp' cannot add"):
        teams.check_owner("m", "vision", "nlp")


# -- reads and each team's own DAGs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "user, theirs",
    [("ann", ["vision", "nlp", "open"]), ("val", ["vision", "open"]), ("zed", ["open"])],
)
def test_a_user_s_teams_are_those_whose_members_name_them(user, theirs):
    assert teams.teams_of(FLEET, user) == theirs  # what Airflow's multi-team mode is told


@pytest.mark.parametrize(
    "team, user, admin, full",
    [
        ("vision", "val", False, True),
        ("vision", "bob", False, False),
        ("vision", None, False, False),
        ("nlp", "x", ADMIN, True),
    ],
)
def test_a_team_s_work_is_read_by_its_members_and_admins(team, user, admin, full):
    from trainyard.acting import Acting

    me = Acting(user, tuple(teams.teams_of(FLEET, user)) if user else (), bool(admin))
    assert me.may_read(team) is full
    if not full:
        with pytest.raises(teams.NotAllowed, match=f"model 'm' belongs to team {team!r}; .* may not read it"):
            me._check_team("m", team)
    me._check_team("m", None)  # no such model: the command says so


def test_a_team_s_training_dag_runs_its_jobs_only():
    from trainyard.spec import SpecError, parse_spec

    assert (teams.training_dag("vision"), teams.training_dag(None)) == ("train_pipeline.vision", "train_pipeline")
    vision = parse_spec({"resources": {"team": "vision"}})
    teams.check_pipeline_team(vision.resources.team, "vision")
    teams.check_pipeline_team(vision.resources.team, None)  # the one DAG of every team
    with pytest.raises(SpecError) as err:
        teams.check_pipeline_team(vision.resources.team, "nlp")
    assert "resources.team: 'vision' is not the team of train_pipeline.nlp, team 'nlp'" in str(err.value)
    assert "team 'vision''s jobs run in train_pipeline.vision" in str(err.value)


def test_a_team_name_airflow_cannot_take_is_named():
    fleet = parse_resources("gpu_types: {cpu: {count: 1, price_per_hour: 0}}\nteams: {ml: {}, vision: {}}\n")
    [problem] = teams.airflow_team_problems(fleet)
    assert problem.startswith("teams.ml: Airflow's multi-team mode needs a team name of 3 to 50")


def test_a_model_s_aliases_move_in_its_owning_team_s_promotion_dag_only():
    teams.check_model_dag("net", "vision", "vision")
    teams.check_model_dag("net", "vision", None)  # the one promote_model of every team
    with pytest.raises(
        NotAllowed,
        match=r"model 'net' belongs to team 'vision': its aliases move in "
        r"promote_model.vision, not in team 'nlp''s promote_model.nlp",
    ):
        teams.check_model_dag("net", "vision", "nlp")


def test_a_team_s_own_dag_names_its_team():
    assert [teams.team_of_dag(d) for d in ("train_pipeline.vision", "promote_model.nlp", "train_pipeline")] == [
        "vision",
        "nlp",
        None,
    ]
