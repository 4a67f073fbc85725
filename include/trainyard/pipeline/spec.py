"""Stage 1, the spec: a raw JobSpec (Params and conf) checked once, by the run's first task, before any data
moves: its fields, the team's policy and budget, the recipe's rules, the sweep, who may run it, and that
the worker can (a custom command needs the sandbox); and that the model and experiment it writes to are
its team's.
"""

from __future__ import annotations

from trainyard.errors import PermanentError
from trainyard.spec import JobSpec, SpecError, parse_spec


def validate_spec(raw: dict, user: str | None = None, audit: bool = True, pipeline_team: str | None = None) -> JobSpec:
    """Parse and check a raw spec (Params merged with conf); raise SpecError naming every bad field.
    ``user``: who triggered the run, who must be a member of its team (None: no person did). ``audit``:
    a refusal by the team's policy is an entry of the audit trail (a run's first task); a check of a file
    (``trainyard validate``) writes nothing. ``pipeline_team``: the team whose own training DAG runs the
    job (None: the one DAG of every team), which must be the job's."""
    from trainyard import recipes
    from trainyard.scheduling.budgets import check_budget, team_standing
    from trainyard.scheduling.resources import check_spec, load_resources
    from trainyard.sweeps.check import check_sweep
    from trainyard.teams import check_member, check_pipeline_team, check_policy
    from trainyard.training.strategies.precision import check_precision

    spec = parse_spec(raw)
    fleet = load_resources()
    check_spec(spec, fleet)
    try:
        check_pipeline_team(spec.resources.team, pipeline_team)
        check_member(spec, fleet, user)
        check_policy(spec, fleet)
    except SpecError as err:  # who tried what, in the audit trail
        if audit:
            from trainyard.audit import AuditLog

            AuditLog().append("policy_refusal", user or "scheduler", team=spec.resources.team, refused=str(err))
        raise
    from trainyard.scheduling.admission.ledger import existing_ledger

    # the run's first task, with the writer's rights: an earlier version's ledger is brought up to date here
    standing = team_standing(fleet, spec.resources.team, existing_ledger(fleet, read_only=False))
    check_budget(spec, fleet, standing)
    recipes.check_spec(spec)
    check_sweep(spec, fleet)
    # On Kubernetes the pods get GPUs exactly when the job names a GPU type, so a precision they cannot do
    # is refused here, before any data moves. A local job's workers use whatever CUDA devices this machine
    # has, which only the workers see (this step does not import torch): they refuse it, naming the field.
    if spec.backends.launcher == "kubernetes":
        check_precision(spec, cuda=spec.resources.gpu_type != "cpu")
    return spec


def check_worker(spec: JobSpec) -> None:
    """What the worker that runs the job must offer, checked on it before any data moves: a local custom
    command needs the sandbox (SandboxUnavailable, saying why, where there is none); a local job of several
    nodes needs its trainings routed to hosts of their own (the cluster profile's ``[trainyard]
    training_queue``), not every task on one host. Apart from validate_spec, which also runs where the job
    is only written (``trainyard validate``)."""
    if spec.recipe == "custom" and spec.backends.launcher == "local":
        from trainyard.training.launchers.sandbox import require

        require()
    if spec.backends.launcher == "local" and spec.resources.nodes > 1:
        from trainyard.scheduling.hosts import routing_prefix

        if routing_prefix() is None:
            raise PermanentError(
                f"resources.nodes is {spec.resources.nodes}: a local job of several nodes trains on hosts of their "
                "own, and this deployment runs every task on one host (no [trainyard] training_queue: the "
                "cluster profile sets it); use nodes: 1 here, or the cluster profile, or Kubernetes"
            )


def check_ownership(spec: JobSpec, client=None, *, claim: bool = False) -> None:
    """Refuse a job that would register into a model, or log into an MLflow experiment, another team owns,
    naming the owner (:mod:`trainyard.registry.ownership`, :func:`trainyard.teams.check_owner`). Checked by
    the run's first task, before any data moves, and again by ``register`` with ``claim``: a model no team
    owns yet is then made, owned by the job's team. A replay registers nothing."""
    if spec.replay_of is not None:
        return
    from trainyard.registry import ownership
    from trainyard.teams import check_owner
    from trainyard.tracking import mlflow_tracking as mt

    c = client or mt.client()
    team = spec.resources.team
    check_owner(spec.name, ownership.claim(c, spec.name, team) if claim else ownership.owner(c, spec.name), team)
    check_owner(spec.name, mt.experiment_owner(c, spec.name), team, what="MLflow experiment")
