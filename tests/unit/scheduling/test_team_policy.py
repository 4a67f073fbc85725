"""Teams as a boundary: who may run a team's jobs, and what its jobs may ask for (namespaces, service
accounts, images, env, their own commands, GPUs per job, priority class), each refusal naming the field
and what is allowed, and written to the audit trail."""

import pytest

from trainyard.errors import PermanentError
from trainyard.scheduling.resources import load_resources, parse_resources
from trainyard.spec import SpecError, parse_spec
from trainyard.teams import check_member, policy_problems

FLEET = parse_resources("""\
gpu_types:
  a100: {count: 8, price_per_hour: 1.0}
teams:
  open: {quota: {a100: 2}}
  vision:
    members: [alice]
    quota: {a100: 4}
    priority: {max: 500}
    policy:
      namespaces: [vision-train]
      service_accounts: [trainer]
      image_prefixes: [registry.example/vision/]
      env: ["NCCL_*", WANDB_MODE]
      max_gpus_per_job: 4
priority_classes: {low: 100, high: 900}
""")


def spec(team="vision", **kubernetes):
    return parse_spec(
        {
            "backends": {"launcher": "kubernetes"},
            "resources": {"team": team, "gpu_type": "a100", "gpus_per_node": 2},
            "kubernetes": {"namespace": "vision-train", "image": "registry.example/vision/train:3", **kubernetes},
        }
    )


def test_only_members_run_a_team_s_jobs():
    check_member(spec(), FLEET, "alice")
    check_member(spec(), FLEET, None)  # a scheduled run acts as the team its job file names
    check_member(spec("open"), FLEET, "anyone")  # a team without members is open to everyone
    with pytest.raises(SpecError, match=r"user 'mallory' is not a member of team 'vision' \(members: alice\)"):
        check_member(spec(), FLEET, "mallory")


def test_a_spec_within_the_policy_passes():
    assert (
        policy_problems(spec(service_account="trainer", env={"NCCL_DEBUG": "INFO", "WANDB_MODE": "off"}), FLEET) == []
    )


@pytest.mark.parametrize(
    "kubernetes, expected",
    [
        (
            {"namespace": "kube-system"},
            "kubernetes.namespace: 'kube-system' is not allowed for team 'vision'; allowed: ['vision-train']",
        ),
        (
            {"service_account": "cluster-admin"},
            "kubernetes.service_account: 'cluster-admin' is not allowed for team 'vision'; allowed: ['trainer']",
        ),
        (
            {"image": "docker.io/evil/miner:1"},
            "kubernetes.image: 'docker.io/evil/miner:1' is not allowed for team "
            "'vision'; allowed: names starting with ['registry.example/vision/']",
        ),
        (
            {"env": {"LD_PRELOAD": "/x.so", "NCCL_DEBUG": "INFO"}},
            "kubernetes.env: ['LD_PRELOAD'] may not be set by team 'vision'; allowed: ['NCCL_*', 'WANDB_MODE']",
        ),
        (
            {"priority_class": "high"},
            "kubernetes.priority_class: 'high' is not allowed for team 'vision'; allowed: ['low']",
        ),
    ],
)
def test_each_refused_field_is_named_with_what_is_allowed(kubernetes, expected):
    assert policy_problems(spec(**kubernetes), FLEET) == [expected]


def test_own_commands_and_large_jobs_are_refused_unless_allowed():
    custom = parse_spec(
        {
            "recipe": "custom",
            "custom": {"command": ["python", "train.py"]},
            "resources": {"team": "vision", "gpu_type": "a100", "gpus_per_node": 6},
        }
    )
    problems = policy_problems(custom, FLEET)
    assert problems[0].startswith("recipe: team 'vision' may not run its own commands")
    assert "may ask for at most 4 GPU(s) per job (policy.max_gpus_per_job); the job asks for 6" in problems[1]


def test_a_local_job_of_several_nodes_runs_only_for_a_team_whose_policy_lets_its_nodes_out_of_the_sandbox(
    monkeypatch,
):
    from trainyard.pipeline.spec import check_worker

    nodes = {"resources": {"team": "vision", "gpu_type": "a100", "nodes": 2, "gpus_per_node": 1}}
    (problem,) = policy_problems(parse_spec(nodes), FLEET)
    assert problem.startswith("resources.nodes: team 'vision' may not train on several nodes with the local launcher")
    assert "policy.local_multi_node is false" in problem
    vision = FLEET.teams["vision"]
    opted_in = vision.model_copy(update={"policy": vision.policy.model_copy(update={"local_multi_node": True})})
    allowed = FLEET.model_copy(update={"teams": {**FLEET.teams, "vision": opted_in}})
    assert policy_problems(parse_spec(nodes), allowed) == []
    on_kubernetes = parse_spec({**nodes, "backends": {"launcher": "kubernetes"}})  # pods: sandboxed by the cluster
    assert not [p for p in policy_problems(on_kubernetes, FLEET) if p.startswith("resources.nodes")]
    monkeypatch.delenv("AIRFLOW__TRAINYARD__TRAINING_QUEUE", raising=False)  # every task on one host
    with pytest.raises(PermanentError, match="trains on hosts of their own, and this deployment runs every task"):
        check_worker(parse_spec(nodes))
    monkeypatch.setenv("AIRFLOW__TRAINYARD__TRAINING_QUEUE", "gpu")  # routed: the cluster profile
    check_worker(parse_spec(nodes))


def test_validate_spec_refuses_a_non_member_and_audits_it(trainyard_home):
    from trainyard.audit import AuditLog
    from trainyard.pipeline import validate_spec

    assert "operator" not in (load_resources().teams["vision"].members or [])
    with pytest.raises(SpecError, match="user 'operator' is not a member of team 'vision'"):
        validate_spec({"resources": {"team": "vision", "gpu_type": "cpu"}}, user="operator")
    (entry,) = AuditLog().entries("policy_refusal")
    assert entry["actor"] == "operator" and entry["team"] == "vision" and "not a member" in entry["refused"]
    validate_spec({"resources": {"team": "default"}}, user="operator")  # everyone is in the default team
