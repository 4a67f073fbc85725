"""The Kubernetes objects of the fleet inventory: what a cluster enforces from the same resources.yaml.

`trainyard cluster manifests | kubectl apply -f -` creates:

* per team, a Namespace (``trainyard-<team>``) and a ResourceQuota capping its GPU requests at the most it
  may ever hold (its quota plus what it may borrow): a backstop if Kueue is bypassed;
* a PriorityClass per ``priority_classes`` entry (the pods' scheduling priority);
* Kueue (``kueue.x-k8s.io/v1beta2``): a ResourceFlavor per GPU type (its node labels), one Cohort holding
  the slots in nobody's quota, a ClusterQueue per team in that cohort with its nominal quota, borrowing
  limit and lending limit per flavor, a LocalQueue in the team's namespace, and a WorkloadPriorityClass per
  priority class.

On a cluster Kueue does what the admission ledger does locally (``admission/policy.py``), preemption included
as resources.yaml says: lent quota is taken back from the borrowers (``reclaimWithinCohort: Any``) where
``scheduling.preemption.enabled``, and within a team whose policy says ``preempt_by_priority``, a higher
priority preempts a lower one (``withinClusterQueue: LowerPriority``). (Kueue knows nothing of the ledger's
minimum runtime, its count of preemptions per job or its sparing of a sweep's trials.)
``flavorFungibility.whenCanBorrow: TryNextFlavor`` makes a team use its own quota of a later flavor before
borrowing an earlier one.

Units: ``nvidia.com/gpu`` counts GPUs, or shares on a time-sliced type (the device plugin advertises each
replica as one). A type with ``mig_profiles`` is partitioned (the mixed strategy): it offers its slices, each
profile a resource of its own (``nvidia.com/mig-<profile>``), and no whole GPU; a team's quota of a slice is
its GPU quota of the type x the slices of that profile per GPU.
"""

from __future__ import annotations

import re

from trainyard.scheduling.resources import ResourcesConfig, max_reach, team_namespace, unassigned
from trainyard.spec import slot_type_of

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU = "nvidia.com/gpu"
COHORT = "trainyard"
LOCAL_QUEUE = "trainyard"
TEAM_LABEL = "trainyard.io/team"  # on a team's namespace and on every pod of its jobs


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: lower case, starting and ending alphanumeric, at most 63
    characters (trainyard's names allow a trailing '.', '-' or '_')."""
    return re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", text.lower())[:63]


CPU_TYPE = "cpu"  # the local CPU workers: no GPU to queue for


def priority_class_name(name: str) -> str:
    """The PriorityClass and WorkloadPriorityClass of a ``priority_classes`` entry."""
    return f"trainyard-{name}"


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


def _gpu_types(config: ResourcesConfig) -> list[str]:
    return [t for t in config.gpu_types if t != CPU_TYPE]


def _quota_entry(name: str, nominal: int, borrowing: int | None, lending: int | None) -> dict:
    entry: dict = {"name": name, "nominalQuota": nominal}
    if borrowing is not None:
        entry["borrowingLimit"] = borrowing
    if lending is not None:
        entry["lendingLimit"] = lending
    return entry


def _resource_groups(config: ResourcesConfig, team: str | None) -> list[dict]:
    """One group of whole GPUs (``nvidia.com/gpu``, a flavor per GPU type) and one per MIG type (its
    slices, each profile's quota its slot type's, :attr:`ResourcesConfig.slot_types`: the ledger's count;
    a flavor sits in one group only). ``team`` None: the cohort's own quota, the slots in nobody's quota.
    Every flavor of a group lists every covered resource, in the group's order (Kueue refuses anything
    else)."""

    def entries(resources: list[tuple[str, str]]) -> list[dict]:
        """(resource name, slot type) -> its quota entry."""
        if team is None:
            return [_quota_entry(name, unassigned(config, slots), None, None) for name, slots in resources]
        return [
            _quota_entry(
                name,
                config.quota(team, slots),
                config.borrowing_limit(team, slots),
                config.lending_limit(team, slots) if _lends(config, team, slots) else None,
            )
            for name, slots in resources
        ]

    whole = [{"name": t, "resources": entries([(GPU, t)])} for t in _gpu_types(config) if not _mig(config, t)]
    groups = [{"coveredResources": [GPU], "flavors": whole}] if whole else []
    for t in _gpu_types(config):
        profiles = _mig(config, t)
        if profiles:
            slices = [(mig_resource(p), slot_type_of(t, p)) for p in profiles]
            groups.append(
                {
                    "coveredResources": [name for name, _ in slices],
                    "flavors": [{"name": t, "resources": entries(slices)}],
                }
            )
    return groups


def _lends(config: ResourcesConfig, team: str, slot_type: str) -> bool:
    """Whether ``team``'s file sets a lending limit for the GPU type of ``slot_type`` (else Kueue lends all)."""
    return slot_type.split(".", 1)[0] in config.teams[team].lending_limit


def _mig(config: ResourcesConfig, gpu_type: str) -> dict[str, int]:
    """A MIG type's profiles: its GPUs are partitioned (mixed strategy), so it offers slices, no whole GPU."""
    return config.gpu_types[gpu_type].mig_profiles


def _team_namespace(config: ResourcesConfig, team: str) -> list[dict]:
    """A team's namespace, and its ResourceQuota: the most GPUs (and MIG slices) it can ever hold at once."""
    hard = {f"requests.{GPU}": str(sum(max_reach(config, team, t) for t in _gpu_types(config) if not _mig(config, t)))}
    for t in _gpu_types(config):
        for p in _mig(config, t):
            key = f"requests.{mig_resource(p)}"
            hard[key] = str(int(hard.get(key, "0")) + max_reach(config, team, slot_type_of(t, p)))
    namespace = team_namespace(team)
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {TEAM_LABEL: team}}},
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "trainyard-gpus", "namespace": namespace},
            "spec": {"hard": hard},
        },
    ]


def _priority_classes(config: ResourcesConfig) -> tuple[list[dict], list[dict]]:
    """The pods' PriorityClasses (the kube-scheduler's order) and Kueue's WorkloadPriorityClasses (its queues')."""
    pod_classes = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(name)},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": f"trainyard jobs of priority class {name} (resources.priority >= {value})",
        }
        for name, value in config.priority_classes.items()
    ]
    workload_classes = [
        {
            "apiVersion": KUEUE_API,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": priority_class_name(name)},
            "value": value,
            "description": f"trainyard jobs of priority class {name}",
        }
        for name, value in config.priority_classes.items()
    ]
    return pod_classes, workload_classes


def _team_queues(config: ResourcesConfig, team: str) -> list[dict]:
    """A team's Kueue ClusterQueue in the fleet's cohort (its quota, what it may borrow and lend) and the
    LocalQueue its jobs name."""
    return [
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": f"trainyard-{team}"},
            "spec": {
                "cohortName": COHORT,
                "namespaceSelector": {"matchLabels": {TEAM_LABEL: team}},
                "queueingStrategy": "BestEffortFIFO",
                "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
                "preemption": {
                    "reclaimWithinCohort": "Any" if config.scheduling.preemption.enabled else "Never",
                    "withinClusterQueue": "LowerPriority" if config.teams[team].policy.preempt_by_priority else "Never",
                },
                "resourceGroups": _resource_groups(config, team),
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": team_namespace(team)},
            "spec": {"clusterQueue": f"trainyard-{team}"},
        },
    ]


def manifests(config: ResourcesConfig) -> list[dict]:
    """Every object, in the order to apply them (namespaces and flavors before what names them)."""
    pod_classes, workload_classes = _priority_classes(config)
    flavors = [
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": t},
            "spec": {"nodeLabels": dict(labels)} if (labels := config.gpu_types[t].node_selector) else {},
        }
        for t in _gpu_types(config)
    ]
    cohort = {
        "apiVersion": KUEUE_API,
        "kind": "Cohort",
        "metadata": {"name": COHORT},
        "spec": {"resourceGroups": _resource_groups(config, None)},
    }
    return [
        *(o for team in config.teams for o in _team_namespace(config, team)),
        *pod_classes,
        *flavors,
        cohort,
        *(o for team in config.teams for o in _team_queues(config, team)),
        *workload_classes,
    ]
