"""The contract every launcher of the seam keeps (trainyard.training.launchers.base), run against each:
plans are pure, the custom command gets the same platform variables, and each try adds one usage record
with the launcher's name and the job's GPUs (none for a try whose workers never started)."""

from datetime import UTC
from pathlib import Path

import pytest
from kubernetes import client as k8s

from datafiles import prepared_in
from trainyard.spec import JobSpec, parse_spec
from trainyard.training import custom, usage
from trainyard.training.launchers.base import Interval, Launcher
from trainyard.training.launchers.command import Host
from trainyard.training.launchers.kubernetes import KubernetesLauncher
from trainyard.training.launchers.local import LocalLauncher
from trainyard.training.run_config import RunConfig

CUSTOM = {"recipe": "custom", "custom": {"command": ["python", "train.py"]}, "resources": {"gpus_per_node": 2}}


class Case:
    """One launcher, with what the contract needs to read back from its plans."""

    def __init__(self, home: Path, kind: str):
        self.home, self.kind = home, kind

    def launcher(self) -> Launcher:
        if self.kind == "local":
            return LocalLauncher(Host(cuda_devices=0, cores=4, env={}, python="/py"))
        return KubernetesLauncher("dag/run", 1, self.home)

    def spec(self, raw: dict) -> JobSpec:
        extra = {} if self.kind == "local" else {"backends": {"launcher": "kubernetes"}}
        return parse_spec({**raw, **extra})

    def env(self, plan) -> dict[str, str]:
        if self.kind == "local":
            return plan.command.env
        (container,) = plan.objects[-1].spec.containers
        return {e.name: e.value for e in container.env if e.value is not None}

    def paths(self, data_dir: Path, run_dir: Path) -> tuple[str, str]:
        """The data and run directories as the workers see them."""
        if self.kind == "local":
            return str(data_dir), str(run_dir)
        return (
            "/var/trainyard/" + str(data_dir.relative_to(self.home)),
            "/var/trainyard/" + str(run_dir.relative_to(self.home)),
        )


@pytest.fixture(params=["local", "kubernetes"])
def case(request, tmp_path):
    return Case(tmp_path, request.param)


def _run(case: Case, raw: dict):
    data_dir = case.home / "cache" / "prepared" / "p"
    run_dir = case.home / "runs" / "r"
    data_dir.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = case.spec(raw)
    data = prepared_in(data_dir)
    config = RunConfig(spec=spec, data=data, out_dir=str(run_dir)).dump(run_dir / "run_config.json")
    return spec, data, data_dir, run_dir, str(config)


def test_a_plan_is_a_function_of_its_inputs(case):
    spec, data, _, run_dir, config = _run(case, {})
    launcher = case.launcher()
    first = launcher.plan(spec, data, run_dir=str(run_dir), config_path=config)
    again = launcher.plan(spec, data, run_dir=str(run_dir), config_path=config)
    assert first == again


def test_the_custom_command_gets_the_platform_variables(case):
    spec, data, data_dir, run_dir, config = _run(case, CUSTOM)
    plan = case.launcher().plan(spec, data, run_dir=str(run_dir), config_path=config)
    expected = custom.platform_env(*case.paths(data_dir, run_dir), spec.hyperparameters.model_dump(mode="json"))
    assert {k: case.env(plan)[k] for k in expected} == expected
    assert "TRAINYARD_TRIAL_VERDICT_FILE" not in case.env(plan)  # named in a sweep trial's run only


def test_each_try_adds_one_record(case):
    spec, data, _, run_dir, config = _run(case, {})
    launcher = case.launcher()
    plan = launcher.plan(spec, data, run_dir=str(run_dir), config_path=config)
    observed = Interval(10.0, 70.0) if case.kind == "local" else [_pod_that_ran(10.0, 70.0)]
    assert launcher.record(spec, run_dir, launcher.collect(plan, observed)) == 1
    assert (
        launcher.record(spec, run_dir, launcher.collect(plan, None if case.kind == "local" else [])) == 2
    )  # never ran
    assert launcher.record(spec, run_dir, launcher.collect(plan, observed)) == 2
    assert [(t["attempt"], t["gpus"], t["where"]) for t in usage.tries(run_dir)] == [
        (1, spec.resources.total_gpus, launcher.where),
        (2, spec.resources.total_gpus, launcher.where),
    ]
    assert usage.gpu_seconds(run_dir) == 2 * 60.0 * spec.resources.total_gpus


def _pod_that_ran(started: float, finished: float) -> k8s.V1Pod:
    from datetime import datetime

    state = k8s.V1ContainerState(
        terminated=k8s.V1ContainerStateTerminated(
            exit_code=0,
            started_at=datetime.fromtimestamp(started, tz=UTC),
            finished_at=datetime.fromtimestamp(finished, tz=UTC),
        )
    )
    return k8s.V1Pod(
        status=k8s.V1PodStatus(
            container_statuses=[
                k8s.V1ContainerStatus(name="trainer", state=state, image="i", image_id="", ready=False, restart_count=0)
            ]
        )
    )
