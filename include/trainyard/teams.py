"""Team policy: who may run, register and move what. A team (``resources.yaml``) is the unit of quota and
the security boundary: it lists its ``members`` (Airflow user names) and a ``policy``. Every entry (the
Airflow UI and REST API, the ``trainyard`` command, a schedule) goes through the one check here for its
kind of action:

* **run** a job: :func:`check_member` (the triggering user is a member of the job's team) and
  :func:`check_policy` (every field the team's policy allows);
* **register** a version of a model: :func:`check_owner` (a model belongs to the team that first
  registered it; model names are one namespace for every team);
* **move an alias** (promote, roll back) and **approve** a move: :func:`check_alias_move` and
  :func:`check_approval` (a promoter of the owning team, or an Airflow admin; the approver another person
  than the requester), with :func:`needs_approval` the owning team's policy, never the requester's choice;
* **read** a team's work (its queued jobs, runs, models, datasets): its members (:func:`teams_of`) and
  admins, as :mod:`trainyard.acting` tells every command; anyone else sees another team's waiting jobs only
  as :data:`SEEN_BY_OTHERS` (team, GPUs, priority);
* **read and write a dataset** repository: :func:`check_dataset_read` and :func:`check_dataset_write`
  (a repository belongs to the team that uploaded it first, or to every team when a built-in source made it:
  :mod:`trainyard.data.ownership`).

Admins (an Airflow ``admin``, as its auth manager says) may act for every team. Nothing here talks to
Airflow, MLflow or the disk: callers bring the facts (who, which team owns what, whether they are admin).
"""

from __future__ import annotations

import fnmatch
import re

from trainyard.errors import PermanentError, spec_error_message
from trainyard.scheduling.resources import ResourcesConfig, team_namespace, unknown_team
from trainyard.spec import JobSpec, SpecError

EVERYONE = "*"
# The DAGs each team has its own of in Airflow's multi-team mode (<name>.<team>; the one <name> without it)
TRAINING_DAG, PROMOTE_DAG, INGEST_DAG = "train_pipeline", "promote_model", "ingest_dataset"
AIRFLOW_TEAM_NAME = r"^[a-zA-Z0-9_-]{3,50}$"  # what Airflow's multi-team mode accepts (`airflow teams create`)
# What of another team's queued job anyone may see: how much of the fleet it asks for, not what or whose.
SEEN_BY_OTHERS = ("gpu_type", "state", "team", "gpus", "priority")


class NotAllowed(PermanentError):
    """The acting user or team may not do this; the message names who, what, and who may."""


# -- who belongs -------------------------------------------------------------------------------------------
def is_member(config: ResourcesConfig, team: str, user: str) -> bool:
    """Whether ``user`` may act for ``team``: listed in its members, or it lists ``"*"`` or no members. A team
    the file does not list has no members: nobody acts for it."""
    if team not in config.teams:
        return False
    members = config.teams[team].members
    return members is None or EVERYONE in members or user in members


def teams_of(config: ResourcesConfig, user: str) -> list[str]:
    """The teams ``user`` is a member of (a team open to everyone included), as Airflow's multi-team mode
    is told them: its DAGs, runs, logs and XComs are the ones this user may see."""
    return [team for team in config.teams if is_member(config, team, user)]


def team_dag(name: str, team: str | None) -> str:
    """``team``'s own DAG ``name`` (:data:`TRAINING_DAG`, :data:`PROMOTE_DAG`, :data:`INGEST_DAG`): ``<name>.<team>`` in
    Airflow's multi-team mode, where each team has its own (:mod:`trainyard_airflow.team_dags`); the one
    ``<name>`` of every team where it is off (None)."""
    return name if team is None else f"{name}.{team}"


def team_of_dag(dag_id: str) -> str | None:
    """The team whose own DAG ``dag_id`` is (:func:`team_dag`'s inverse), or None: a DAG of every team."""
    for name in (TRAINING_DAG, PROMOTE_DAG, INGEST_DAG):
        if dag_id.startswith(f"{name}."):
            return dag_id[len(name) + 1 :]
    return None


def training_dag(team: str | None) -> str:
    """The training DAG of ``team``'s jobs (:func:`team_dag`)."""
    return team_dag(TRAINING_DAG, team)


def check_pipeline_team(job_team: str, team: str | None) -> None:
    """SpecError unless a job of ``job_team`` (its ``resources.team``) may run in the training DAG of
    ``team``: only that team's (None: the one DAG of an installation without teams of its own in Airflow
    runs every team's)."""
    if team is not None and job_team != team:
        raise SpecError(
            spec_error_message(
                [
                    f"resources.team: {job_team!r} is not the team of {training_dag(team)}, team {team!r}'s "
                    f"training DAG; team {job_team!r}'s jobs run in {training_dag(job_team)}"
                ]
            )
        )


def airflow_team_problems(config: ResourcesConfig) -> list[str]:
    """What keeps the teams of ``config`` from being Airflow teams, one line each."""
    return [
        f"teams.{team}: Airflow's multi-team mode needs a team name of 3 to 50 letters, digits, '-' or '_'; "
        "rename the team in resources.yaml"
        for team in config.teams
        if not re.match(AIRFLOW_TEAM_NAME, team)
    ]


def _named_promoters(config: ResourcesConfig, team: str) -> list[str] | None:
    """Who of ``team`` may move its models' aliases, by name: its policy's ``promoters``, else its members;
    None when that list is absent or holds ``"*"`` (every member may)."""
    policy, members = config.teams[team].policy, config.teams[team].members
    named = policy.promoters if policy.promoters is not None else members
    return None if named is None or EVERYONE in named else named


def may_promote(config: ResourcesConfig, team: str, user: str) -> bool:
    """Whether ``user`` may move ``team``'s models' aliases and approve such a move: a member who is one of
    its policy's ``promoters`` (absent: every member)."""
    if not is_member(config, team, user):
        return False
    named = _named_promoters(config, team)
    return named is None or user in named


def _promoters_text(config: ResourcesConfig, team: str) -> str:
    named = _named_promoters(config, team)
    return "every user" if named is None else ", ".join(sorted(named)) or "nobody"


# -- run ---------------------------------------------------------------------------------------------------
def check_member(spec: JobSpec, config: ResourcesConfig, user: str | None) -> None:
    """Refuse a job for a team ``user`` is not a member of, naming both. ``user`` None: a run no person
    triggered (a schedule, an asset event), which acts as the team its job file names."""
    check_member_of(config, spec.resources.team, user, field="resources.team", what="run it")


def check_member_of(config: ResourcesConfig, team: str, user: str | None, *, field: str, what: str) -> None:
    """SpecError unless ``user`` (None: no person, a run acting as ``team``) may act for ``team``; ``field``
    names the input that said the team and ``what`` the act (run it, upload it)."""
    if user is None or is_member(config, team, user):
        return
    if team not in config.teams:
        raise SpecError(spec_error_message([unknown_team(team, config, field)]))
    members = config.teams[team].members or []
    raise SpecError(
        spec_error_message(
            [
                f"{field}: user {user!r} is not a member of team {team!r} (members: "
                f"{', '.join(sorted(members)) or 'none'}); {what} as a team you belong to, or ask for {user!r} "
                "to be added to the team's members in resources.yaml"
            ]
        )
    )


def policy_problems(spec: JobSpec, config: ResourcesConfig) -> list[str]:
    """Every field of ``spec`` its team's policy does not allow, each with what is allowed."""
    team = spec.resources.team
    if team not in config.teams:
        return [unknown_team(team, config)]
    policy = config.teams[team].policy
    problems = []
    if spec.recipe == "custom" and not policy.custom_commands:
        problems.append(
            f"recipe: team {team!r} may not run its own commands (policy.custom_commands is false); "
            "use a built-in recipe, or ask for custom_commands in resources.yaml"
        )
    if spec.backends.launcher == "local" and spec.resources.nodes > 1 and not policy.local_multi_node:
        problems.append(
            f"resources.nodes: team {team!r} may not train on several nodes with the local launcher, whose nodes "
            "run outside the sandbox (policy.local_multi_node is false); use backends.launcher 'kubernetes', "
            "or ask for local_multi_node in resources.yaml"
        )
    if policy.max_gpus_per_job is not None and spec.resources.total_gpus > policy.max_gpus_per_job:
        problems.append(
            f"resources.gpus_per_node: team {team!r} may ask for at most {policy.max_gpus_per_job} GPU(s) per "
            f"job (policy.max_gpus_per_job); the job asks for {spec.resources.total_gpus}"
        )
    k8s = spec.kubernetes
    if spec.backends.launcher == "kubernetes":
        images = [("kubernetes.image", k8s.image)] + (
            [("custom.image", spec.custom.image)] if spec.custom and spec.custom.image else []
        )
        problems += kubernetes_problems(
            config,
            team,
            namespace=k8s.namespace,
            service_account=k8s.service_account,
            images=images,
            env_names=list(k8s.env),
            priority_class=k8s.priority_class,
        )
    return problems


def kubernetes_problems(
    config: ResourcesConfig,
    team: str,
    *,
    namespace: str,
    service_account: str | None,
    images: list[tuple[str, str]],
    env_names: list[str],
    priority_class: str | None,
) -> list[str]:
    """What team ``team``'s policy does not allow of what its pods are given (``images``: (field, image)):
    the one definition the JobSpec check and the pod check (:mod:`trainyard_airflow.policy`) use."""
    policy = config.teams[team].policy
    problems = []
    namespaces = policy.namespaces if policy.namespaces is not None else ["trainyard", team_namespace(team)]
    if namespace not in namespaces:
        problems.append(f"kubernetes.namespace: {namespace!r} is not allowed for team {team!r}; allowed: {namespaces}")
    if service_account is not None and service_account not in policy.service_accounts:
        allowed = policy.service_accounts or "only the namespace's default (leave it unset)"
        problems.append(
            f"kubernetes.service_account: {service_account!r} is not allowed for team {team!r}; allowed: {allowed}"
        )
    for field, image in images:
        if not any(image.startswith(prefix) for prefix in policy.image_prefixes):
            problems.append(
                f"{field}: {image!r} is not allowed for team {team!r}; allowed: names starting with "
                f"{policy.image_prefixes}"
            )
    refused_env = sorted(name for name in env_names if not any(fnmatch.fnmatchcase(name, p) for p in policy.env))
    if refused_env:
        problems.append(
            f"kubernetes.env: {refused_env} may not be set by team {team!r}; allowed: {policy.env or 'none'}"
        )
    if priority_class is not None:
        value = config.priority_classes.get(priority_class)
        ceiling = config.teams[team].priority.max
        if value is None or value > ceiling:
            allowed_classes = sorted(n for n, v in config.priority_classes.items() if v <= ceiling)
            problems.append(
                f"kubernetes.priority_class: {priority_class!r} is not allowed for team {team!r}; allowed: "
                f"{allowed_classes}"
            )
    return problems


def pod_team(pod) -> str | None:
    """The team label of a pod (a ``kubernetes`` client V1Pod); None: not trainyard's pod."""
    from trainyard.scheduling.cluster import TEAM_LABEL

    return ((pod.metadata and pod.metadata.labels) or {}).get(TEAM_LABEL)


def pod_problems(pod, config: ResourcesConfig) -> list[str]:
    """What the policy of the team a pod is labelled for (:func:`pod_team`) does not allow of the pod as it
    will be created: its namespace, service account, images and priority class (after every mutation; the
    environment is the JobSpec's check, as the platform's own variables are in the pod too)."""
    from trainyard.scheduling import cluster

    label = pod_team(pod)
    teams = [t for t in config.teams if cluster.label_value(t) == label]
    if len(teams) != 1:
        found = "is no team" if not teams else f"matches several teams {teams}"
        return [f"metadata.labels: {cluster.TEAM_LABEL}={label!r} {found} of resources.yaml ({sorted(config.teams)})"]
    from kubernetes.client import V1PodSpec

    spec = pod.spec or V1PodSpec(containers=[])
    containers = [*(spec.init_containers or []), *(spec.containers or [])]
    # the classes `trainyard cluster manifests` creates are named for the priority_classes entries
    named = {cluster.priority_class_name(n): n for n in config.priority_classes}
    return kubernetes_problems(
        config,
        teams[0],
        namespace=pod.metadata.namespace or "default",
        service_account=spec.service_account_name or spec.service_account,  # the API copies the old field over
        images=[(f"containers.{c.name}.image", c.image or "") for c in containers],
        env_names=[],
        priority_class=named.get(spec.priority_class_name, spec.priority_class_name),
    )


def check_pod(pod, config: ResourcesConfig) -> None:
    """SpecError naming what a team's pod may not have (:func:`pod_problems`), a pod labelled for no team
    included: the training operators' check of their own pods after every cluster policy ran (one that
    removed the team label must not take the pod past the check). The pod hook, which sees every operator's
    pods, asks only of those with a team label (:func:`pod_team`)."""
    problems = pod_problems(pod, config)
    if problems:
        raise SpecError(spec_error_message(problems))


def check_policy(spec: JobSpec, config: ResourcesConfig) -> None:
    """SpecError naming every field of ``spec`` that its team's policy does not allow."""
    problems = policy_problems(spec, config)
    if problems:
        raise SpecError(spec_error_message(problems))


# -- register ----------------------------------------------------------------------------------------------
def check_owner(model: str, owner: str | None, team: str, *, what: str = "model") -> None:
    """Refuse ``team`` adding a version to ``model``, owned by ``owner`` (None: a model no team owns yet,
    which the registering team will own), unless it is ``team``'s. ``what``: ``"MLflow experiment"`` for
    the runs' experiment of the same name, which a team owns as it does a model."""
    if owner is not None and owner != team:
        adds = "add versions to it" if what == "model" else "log runs into it"
        raise NotAllowed(
            f"name: {what} {model!r} belongs to team {owner!r}; a job of team {team!r} cannot {adds} "
            "(job and model names are one namespace for every team): give the job another name, or run it as a "
            f"member of team {owner!r}"
        )


# -- read and write data ----------------------------------------------------------------------------------
def check_dataset_read(repo: str, owner: str, teams: list[str], *, public: bool, admin: bool = False) -> None:
    """Refuse reading dataset repository ``repo``, owned by team ``owner``, for one acting as ``teams`` (a
    job: its team; a user: theirs), unless it is public (a built-in source's) or one of ``teams``' own."""
    if public or admin or owner in teams:
        return
    raise NotAllowed(
        f"dataset.repo: dataset repository {repo!r} belongs to team {owner!r}; {_acting(teams)} may not read it: "
        f"upload the data as a repository of your own team, or act as a member of team {owner!r}"
    )


def check_dataset_write(
    repo: str, owner: str, team: str, *, public: bool, repo_source: str | None, source: str | None
) -> None:
    """Refuse team ``team`` writing to dataset repository ``repo`` (owned by ``owner``): an upload
    (``source`` None) or a built-in ``source``'s ingest. A public repository takes only the ingest of the
    source it holds (``repo_source``); a team's, only its own team's writes."""
    if public:
        if source is None:
            raise NotAllowed(
                f"dataset repository {repo!r} holds the built-in source {repo_source!r}, shared by every team, and "
                "takes no uploads: upload to a repository of your own (another repository name)"
            )
        if source != repo_source:
            raise NotAllowed(
                f"dataset.source: dataset repository {repo!r} holds the built-in source {repo_source!r}; ingest "
                f"{source!r} into another repository (dataset.repo)"
            )
        return
    if owner != team:
        raise NotAllowed(
            f"dataset.repo: dataset repository {repo!r} belongs to team {owner!r}; team {team!r} may not write to it: "
            f"use another repository name, or act as a member of team {owner!r}"
        )


def _acting(teams: list[str]) -> str:
    return (
        "nobody logged in"
        if not teams
        else ("team " if len(teams) == 1 else "teams ") + ", ".join(repr(t) for t in sorted(teams))
    )


# -- move an alias, approve a move -------------------------------------------------------------------------
def check_alias_move(config: ResourcesConfig, model: str, owner: str, user: str | None, *, admin: bool) -> None:
    """Refuse ``user`` moving an alias of ``model`` (owned by team ``owner``) unless they are an admin or
    one of the owning team's promoters. ``user`` None: no person asked (a move needs one)."""
    if user is None:
        raise NotAllowed(f"an alias of {model!r} moves only at a person's request: trigger it as an Airflow user")
    if admin:
        return
    if owner not in config.teams:
        raise NotAllowed(
            f"model {model!r} belongs to team {owner!r}, which resources.yaml no longer lists: only an Airflow "
            "admin may move its aliases"
        )
    if not may_promote(config, owner, user):
        raise NotAllowed(
            f"user {user!r} may not move aliases of model {model!r}: it belongs to team {owner!r}, whose "
            f"promoters are {_promoters_text(config, owner)} (resources.yaml teams.{owner}.policy.promoters), "
            "besides Airflow admins"
        )


def check_model_dag(model: str, owner: str, team: str | None) -> None:
    """NotAllowed unless ``team``'s own promotion DAG (None: the one of every team) may move the aliases of
    ``model``, which ``owner`` owns: its runs, logs and approvals are seen by the owning team only."""
    if team is not None and owner != team:
        raise NotAllowed(
            f"model {model!r} belongs to team {owner!r}: its aliases move in {team_dag(PROMOTE_DAG, owner)}, "
            f"not in team {team!r}'s {team_dag(PROMOTE_DAG, team)}"
        )


def needs_approval(config: ResourcesConfig, owner: str, alias: str) -> bool:
    """Whether a move of ``alias`` of a model of team ``owner`` waits for another person's approval: the
    team's ``policy.approval`` (a team the file no longer lists: always)."""
    return owner not in config.teams or alias in config.teams[owner].policy.approval


def approvers(config: ResourcesConfig, owner: str, requester: str, admins: list[str]) -> list[str] | None:
    """The users who may approve ``requester``'s move of a model of team ``owner``, by name: its promoters
    and the admins, the requester never. None: everyone but the requester may (a team open to all)."""
    named: set[str] = set(admins)
    if owner in config.teams:
        listed = _named_promoters(config, owner)
        if listed is None:  # every member may: by name only where the members are named
            members = config.teams[owner].members
            if members is None or EVERYONE in members:
                return None
            listed = members
        named |= {u for u in listed if is_member(config, owner, u)}
    return sorted(named - {requester})


def check_approval(
    config: ResourcesConfig, model: str, owner: str, requester: str, approver: str | None, *, admin: bool
) -> None:
    """Refuse a move whose approval is missing, given by the requester themself, or by someone who may not
    move the model's aliases."""
    if approver is None:
        raise NotAllowed(f"the move of an alias of {model!r} needs an approval, and none was recorded")
    if approver == requester:
        raise NotAllowed(
            f"{approver!r} approved their own move of an alias of {model!r}; another promoter of team {owner!r} "
            "or an Airflow admin must approve it"
        )
    if admin or (owner in config.teams and may_promote(config, owner, approver)):
        return
    raise NotAllowed(
        f"{approver!r} may not approve moves of aliases of {model!r}: it belongs to team {owner!r}, whose "
        f"promoters are {_promoters_text(config, owner)}, besides Airflow admins"
    )
