import pytest

from trainyard.scheduling.resources import check_spec, load_resources, parse_resources, pool_name, pools, run_cost
from trainyard.spec import SpecError, parse_spec


def test_pools_from_the_shipped_resources_file():
    cfg = load_resources()
    result = pools(cfg)
    assert result["gpu-cpu"]["slots"] == cfg.gpu_types["cpu"].count
    assert set(result) == {pool_name(t) for t in cfg.slot_types}  # a MIG type's pools are its profiles'
    assert result["gpu-a100-mig.1g.10gb"]["slots"] == cfg.gpu_types["a100-mig"].count * 3


@pytest.mark.parametrize(
    "resources, field",
    [
        ({"gpu_type": "tpu-v9"}, "resources.gpu_type: unknown GPU type 'tpu-v9'"),
        ({"team": "nobody"}, "resources.team: unknown team"),
        ({"gpu_type": "cpu", "gpus_per_node": 64}, "but pool 'gpu-cpu' has only"),
    ],
)
def test_unschedulable_specs_are_refused(resources, field):
    with pytest.raises(SpecError, match=field):
        check_spec(parse_spec({"resources": resources}), load_resources())


@pytest.mark.parametrize(
    "gpu_type, profile, refused",
    [
        ("a100-mig", "1g.10gb", None),
        ("a100-mig", "2g.20gb", None),
        ("a100-mig", "3g.40gb", r"'a100-mig' is partitioned .* name one of \['1g.10gb', '2g.20gb'\] \(got '3g.40gb'\)"),
        ("a100-mig", None, r"offers only its slices: name one of \['1g.10gb', '2g.20gb'\] \(none was named\)"),
        ("a100-80gb", "1g.10gb", r"'a100-80gb' is not partitioned .* choose a MIG type: \['a100-mig'\]"),
        ("cpu", "1g.10gb", "'cpu' is not partitioned"),
        ("a100-80gb", None, None),
    ],
)
def test_a_job_names_a_mig_profile_its_gpu_type_has_or_is_refused_naming_those_there_are(gpu_type, profile, refused):
    from trainyard.scheduling.resources import team_namespace

    job = {
        "resources": {"gpu_type": gpu_type, "mig_profile": profile, "gpus_per_node": 1, "team": "research"},
        "backends": {"launcher": "kubernetes"},
        "kubernetes": {"namespace": team_namespace("research")},
    }
    local = {**job, "backends": {"launcher": "local"}}
    for spec in (job, local):  # a MIG type's slices are counted per profile wherever the job runs
        if refused is None:
            check_spec(parse_spec(spec), load_resources())
        else:
            with pytest.raises(SpecError, match="resources.mig_profile: .*" + refused):
                check_spec(parse_spec(spec), load_resources())


def test_a_spec_written_with_the_profile_in_its_old_place_still_reads():
    """Run configs, registered versions and old runs' confs name ``kubernetes.mig_profile`` (null on every
    job of another type): it is read in its new place; two different profiles are refused."""
    old = parse_spec({"resources": {"gpu_type": "a100-mig"}, "kubernetes": {"mig_profile": "1g.10gb"}})
    assert (old.resources.mig_profile, old.resources.slot_type) == ("1g.10gb", "a100-mig.1g.10gb")
    assert parse_spec({"kubernetes": {"mig_profile": None}}).resources.mig_profile is None
    with pytest.raises(SpecError, match=r"kubernetes.mig_profile \('1g.10gb'\) and resources.mig_profile"):
        parse_spec({"resources": {"mig_profile": "2g.20gb"}, "kubernetes": {"mig_profile": "1g.10gb"}})


def test_a_mig_type_offers_each_profile_s_slices_as_slots_and_pools_quotas_kueue_and_prices_agree():
    """a100-mig (2 GPUs, each 3 x 1g.10gb + 2 x 2g.20gb) counts 6 and 4 slots, not 2: the pools, a team's
    quota (its GPUs x the profile's slices per GPU), Kueue's ClusterQueues and the cohort, and the price
    (the slice's share of the GPU's 7 compute slices); a time-sliced type's shares agree the same way."""
    from trainyard.scheduling import cluster
    from trainyard.scheduling.resources import pool_name, pools

    config = parse_resources(
        "gpu_types:\n"
        "  a100-mig: {count: 2, price_per_hour: 1.4, mig_profiles: {1g.10gb: 3, 2g.20gb: 2}}\n"
        "  v100: {count: 2, price_per_hour: 1.0, time_slicing: {replicas: 4}}\n"
        "teams:\n"
        "  vision: {quota: {a100-mig: 1, v100: 1}, borrowing_limit: {a100-mig: 1}}\n"
        "  nlp: {quota: {v100: 1}, lending_limit: {v100: 1}}\n"
    )
    slots = {t: (g.slots, round(g.price_per_hour, 4)) for t, g in config.slot_types.items()}
    assert slots == {"a100-mig.1g.10gb": (6, 0.2), "a100-mig.2g.20gb": (4, 0.4), "v100": (8, 1.0)}
    assert {name: p["slots"] for name, p in pools(config).items()} == {
        pool_name("a100-mig.1g.10gb"): 6, pool_name("a100-mig.2g.20gb"): 4, pool_name("v100"): 8
    }  # fmt: skip
    assert (config.quota("vision", "a100-mig.1g.10gb"), config.borrowing_limit("vision", "a100-mig.2g.20gb")) == (3, 2)
    # a time-sliced type's quotas are written in its shares already
    assert (config.quota("vision", "v100"), config.lending_limit("nlp", "v100")) == (1, 1)
    queues = {
        m["metadata"]["name"]: m["spec"] for m in cluster.manifests(config) if m["kind"] in ("ClusterQueue", "Cohort")
    }
    kueue = {
        (name, r["name"]): r["nominalQuota"]
        for name, spec in queues.items()
        for group in spec["resourceGroups"]
        for flavor in group["flavors"]
        for r in flavor["resources"]
    }
    for team in ("vision", "nlp"):
        for slot_type, resource in (("a100-mig.1g.10gb", "nvidia.com/mig-1g.10gb"), ("v100", "nvidia.com/gpu")):
            assert kueue[(f"trainyard-{team}", resource)] == config.quota(team, slot_type), (team, slot_type)
    assert kueue[("trainyard", "nvidia.com/mig-2g.20gb")] == 4 - 2  # the slices in nobody's quota


def test_cost_is_price_times_hours_times_gpus():
    cfg = load_resources()
    price = cfg.gpu_types["h100-80gb"].price_per_hour
    assert run_cost(cfg, "h100-80gb", 8 * 1800) == pytest.approx(price * 0.5 * 8)


def test_collect_training_costs_every_recorded_try(trainyard_home, tmp_path):
    """A retry adds its own usage record: the cost is of both tries, not of the last one alone."""
    import json

    from trainyard import pipeline
    from trainyard.pipeline.records import TrainingPlan
    from trainyard.tracking import mlflow_tracking as mt
    from trainyard.training import usage

    spec = parse_spec({"resources": {"gpu_type": "h100-80gb", "gpus_per_node": 2}})
    c = mt.client()
    run_id = c.create_run(mt.experiment_id(c, "cost", "default")).info.run_id
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train_result.json").write_text(json.dumps({"steps": 10, "val_accuracy": 0.75}))
    (tmp_path / "work" / "model.pt").write_bytes(b"weights")
    usage.record_try(tmp_path, attempt=1, started=1000.0, ended=1600.0, gpus=2, where="local")  # failed try
    usage.record_try(tmp_path, attempt=2, started=2000.0, ended=2900.0, gpus=2, where="local")
    plan = TrainingPlan(
        config_path=str(tmp_path / "run_config.json"),
        run_dir=str(tmp_path),
        mlflow_run_id=run_id,
        tensorboard_dir=str(tmp_path / "tb"),
    )

    out = pipeline.collect_training(spec, plan)

    price = load_resources().gpu_types["h100-80gb"].price_per_hour
    assert out.gpu_seconds == pytest.approx(2 * 600 + 2 * 900)
    assert out.cost == pytest.approx(price * (2 * 600 + 2 * 900) / 3600)
    assert out.tries == 2
    assert c.get_run(run_id).data.metrics["run_cost"] == pytest.approx(out.cost)
    # the record of it: the loop's fields, the model where the platform expects it, the val_* metrics in one field
    assert (out.steps, out.model_path) == (10, str(tmp_path / "work" / "model.pt"))
    assert out.final_metrics == {"val_accuracy": 0.75}
    from trainyard.training.run_config import WorkerOutputError

    (tmp_path / "work" / "train_result.json").write_text(json.dumps({"steps": "ten", "val_accuracy": 0.75}))
    with pytest.raises(
        WorkerOutputError, match="does not fit the training's record: steps of"
    ):  # plain, but not its type
        pipeline.collect_training(spec, plan)


def test_a_broken_edit_leaves_the_last_good_resources_in_force(trainyard_home, tmp_path):
    """The queue's reader keeps the last version that parsed and says, at every look, what is wrong with
    the new one (file, line, field); with no good version to fall back on it raises the same message."""
    from trainyard.scheduling.resources import ResourcesError, resources_in_force

    path = tmp_path / "resources.yaml"
    path.write_text("gpu_types:\n  a100: {count: 8, price_per_hour: 1.0}\nteams:\n  vision: {quota: {a100: 4}}\n")
    assert resources_in_force(path).quota("vision", "a100") == 4
    path.write_text("gpu_types:\n  a100: {count: 8, price_per_hour: 1.0}\nteams:\n  vision: {quota: {a100: 40}}\n")
    said: list[str] = []
    config = resources_in_force(path, said.append)
    assert config.quota("vision", "a100") == 4
    assert f"{path}:4: teams.vision.quota.a100" in said[0] and "keeps the last good version" in said[0]
    path.unlink()  # removed by mistake: the same
    assert resources_in_force(path, said.append).quota("vision", "a100") == 4
    (trainyard_home / "scheduling" / "resources.last-good.yaml").unlink()
    path.write_text("teams: [")
    with pytest.raises(ResourcesError, match="not YAML"):
        resources_in_force(path, said.append)
