"""`trainyard cluster manifests`: the core objects pass kubernetes-validate (strict); the Kueue objects are
checked against Kueue's v1beta2 API as a model here (field names and nesting from its Go types in
kubernetes-sigs/kueue apis/kueue/v1beta2; a misspelt field fails), with its rules: every flavor of a
resource group lists every covered resource in the same order, a flavor in one group only, the
flavors and the cohort that the queues name exist, and the quotas add up to the inventory."""

from __future__ import annotations

from typing import Literal

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainyard.scheduling import cluster
from trainyard.scheduling.resources import load_resources, parse_resources


class _K(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Meta(_K):
    name: str
    namespace: str | None = None
    labels: dict[str, str] | None = None


class ResourceQuota(_K):
    name: str
    nominalQuota: int | str
    borrowingLimit: int | str | None = None
    lendingLimit: int | str | None = None


class FlavorQuotas(_K):
    name: str
    resources: list[ResourceQuota] = Field(max_length=64)


class ResourceGroup(_K):
    coveredResources: list[str] = Field(max_length=64)
    flavors: list[FlavorQuotas] = Field(max_length=64)


class LabelSelector(_K):
    matchLabels: dict[str, str] | None = None


class FlavorFungibility(_K):
    whenCanBorrow: Literal["MayStopSearch", "TryNextFlavor"] | None = None
    whenCanPreempt: Literal["MayStopSearch", "TryNextFlavor"] | None = None


class Preemption(_K):
    reclaimWithinCohort: Literal["Never", "LowerPriority", "Any"] | None = None
    withinClusterQueue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] | None = None


class ClusterQueueSpec(_K):
    cohortName: str | None = None
    namespaceSelector: LabelSelector | None = None
    queueingStrategy: Literal["StrictFIFO", "BestEffortFIFO"] | None = None
    flavorFungibility: FlavorFungibility | None = None
    preemption: Preemption | None = None
    resourceGroups: list[ResourceGroup] = Field(max_length=16)


class ResourceFlavorSpec(_K):
    nodeLabels: dict[str, str] | None = None


class CohortSpec(_K):
    parentName: str | None = None
    resourceGroups: list[ResourceGroup] = Field(max_length=16)


class LocalQueueSpec(_K):
    clusterQueue: str


class Kueue(_K):
    apiVersion: Literal["kueue.x-k8s.io/v1beta2"]
    kind: Literal["ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"]
    metadata: Meta
    spec: dict | None = None
    value: int | None = None  # WorkloadPriorityClass: top level, not under spec
    description: str | None = None


SPECS = {
    "ResourceFlavor": ResourceFlavorSpec,
    "Cohort": CohortSpec,
    "ClusterQueue": ClusterQueueSpec,
    "LocalQueue": LocalQueueSpec,
}


def check_kueue(obj: dict) -> None:
    """Raise if ``obj`` is not a valid Kueue v1beta2 object as trainyard writes them."""
    k = Kueue.model_validate(obj)
    if k.kind == "WorkloadPriorityClass":
        assert k.spec is None and k.value is not None
        return
    spec = SPECS[k.kind].model_validate(k.spec or {})
    seen: set[str] = set()
    for group in getattr(spec, "resourceGroups", []):
        for flavor in group.flavors:
            # Kueue's rule: the same resources, in the covered order, for every flavor of the group
            assert [r.name for r in flavor.resources] == group.coveredResources, (k.metadata.name, flavor.name)
            assert flavor.name not in seen, f"flavor {flavor.name} in two resource groups of {k.metadata.name}"
            seen.add(flavor.name)
    if k.kind == "ClusterQueue":  # borrowingLimit only in a cohort
        assert spec.cohortName or not any(
            r.borrowingLimit for g in spec.resourceGroups for f in g.flavors for r in f.resources
        )


@pytest.fixture(scope="module")
def objects():
    return cluster.manifests(load_resources())


def test_core_objects_are_valid_kubernetes(objects):
    core = [o for o in objects if not o["apiVersion"].startswith("kueue.")]
    assert {o["kind"] for o in core} == {"Namespace", "ResourceQuota", "PriorityClass"}
    for version in ("1.33", kubernetes_validate.latest_version()):
        for obj in core:
            kubernetes_validate.validate(obj, version, strict=True)


def test_kueue_objects_follow_the_api_and_its_rules(objects):
    kueue = [o for o in objects if o["apiVersion"].startswith("kueue.")]
    for obj in kueue:
        check_kueue(obj)
    names = {(o["kind"], o["metadata"]["name"]) for o in kueue}
    flavors = {n for k, n in names if k == "ResourceFlavor"}
    for obj in kueue:
        if obj["kind"] in ("ClusterQueue", "Cohort"):
            assert {f["name"] for g in obj["spec"]["resourceGroups"] for f in g["flavors"]} <= flavors
        if obj["kind"] == "ClusterQueue":
            assert ("Cohort", obj["spec"]["cohortName"]) in names
        if obj["kind"] == "LocalQueue":
            assert ("ClusterQueue", obj["spec"]["clusterQueue"]) in names


def test_the_checker_catches_a_misspelt_field_or_a_resource_out_of_order(objects):
    queue = next(o for o in objects if o["kind"] == "ClusterQueue")
    misspelt = yaml.safe_load(yaml.safe_dump(queue).replace("cohortName", "cohort"))  # the v1beta1 name
    with pytest.raises(ValueError, match="cohort"):
        check_kueue(misspelt)
    typo = yaml.safe_load(yaml.safe_dump(queue).replace("nominalQuota", "nominalQuotas"))
    with pytest.raises(ValueError):
        check_kueue(typo)
    mig = next(g for g in queue["spec"]["resourceGroups"] if len(g["coveredResources"]) > 1)
    mig["flavors"][0]["resources"].reverse()
    with pytest.raises(AssertionError):
        check_kueue(queue)


FLEET = """\
gpu_types:
  cpu: {count: 2, price_per_hour: 0}
  a100: {count: 8, price_per_hour: 1.0, node_selector: {nvidia.com/gpu.product: A100}}
  h100: {count: 4, price_per_hour: 2.0, time_slicing: {replicas: 2}}
  mig: {count: 2, price_per_hour: 1.0, mig_profiles: {1g.10gb: 7}}
teams:
  vision: {quota: {a100: 4, h100: 4, mig: 1}, borrowing_limit: {a100: 2}}
  nlp: {quota: {a100: 2, h100: 2}, lending_limit: {a100: 1}}
priority_classes: {low: 10, high: 800}
"""


def test_quotas_add_up_to_the_inventory():
    cfg = parse_resources(FLEET)
    objs = cluster.manifests(cfg)
    queues = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterQueue"}
    cohort = next(o for o in objs if o["kind"] == "Cohort")

    def nominal(obj, flavor, resource):
        for g in obj["spec"]["resourceGroups"]:
            for f in g["flavors"]:
                if f["name"] == flavor:
                    return next(r for r in f["resources"] if r["name"] == resource)
        raise KeyError(flavor)

    for flavor, resource, total in (
        ("a100", "nvidia.com/gpu", 8),
        ("h100", "nvidia.com/gpu", 8),
        ("mig", "nvidia.com/mig-1g.10gb", 14),
    ):
        held = sum(nominal(q, flavor, resource)["nominalQuota"] for q in queues.values())
        assert held + nominal(cohort, flavor, resource)["nominalQuota"] == total, flavor
    assert nominal(queues["trainyard-vision"], "a100", "nvidia.com/gpu").get("borrowingLimit") == 2
    assert nominal(queues["trainyard-nlp"], "a100", "nvidia.com/gpu").get("lendingLimit") == 1
    assert nominal(queues["trainyard-vision"], "mig", "nvidia.com/mig-1g.10gb")["nominalQuota"] == 7
    assert "cpu" not in {o["metadata"]["name"] for o in objs if o["kind"] == "ResourceFlavor"}
    quota = next(o for o in objs if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "trainyard-vision")
    # vision's most: a100 4 + 2 borrowed; all 8 h100 shares (4 + nlp's 2 + 2 in nobody's quota); both MIG GPUs
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "14", "requests.nvidia.com/mig-1g.10gb": "14"}
    assert {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "PriorityClass"} == {
        "trainyard-low": 10,
        "trainyard-high": 800,
    }


def test_cli_prints_the_manifests_for_kubectl(capsys):
    from trainyard.cli import main

    assert main(["cluster", "manifests"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == cluster.manifests(load_resources())


def test_kueue_preempts_as_resources_yaml_says():
    """reclaimWithinCohort follows scheduling.preemption.enabled; withinClusterQueue a team's
    preempt_by_priority, as the local ledger does."""

    def preemption(fleet: str) -> dict[str, dict]:
        objs = cluster.manifests(parse_resources(fleet))
        return {o["metadata"]["name"]: o["spec"]["preemption"] for o in objs if o["kind"] == "ClusterQueue"}

    by_default = preemption(FLEET)
    assert {p["reclaimWithinCohort"] for p in by_default.values()} == {"Any"}
    assert {p["withinClusterQueue"] for p in by_default.values()} == {"Never"}
    assert {
        p["reclaimWithinCohort"] for p in preemption(FLEET + "scheduling: {preemption: {enabled: false}}\n").values()
    } == {"Never"}
    by_priority = preemption(
        FLEET.replace("borrowing_limit: {a100: 2}}", "borrowing_limit: {a100: 2}, policy: {preempt_by_priority: true}}")
    )
    assert by_priority["trainyard-vision"]["withinClusterQueue"] == "LowerPriority"
    assert by_priority["trainyard-nlp"]["withinClusterQueue"] == "Never"
