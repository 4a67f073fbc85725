"""Checkpoints that survive failures, with real processes: a worker killed with SIGKILL mid-epoch, and an
Airflow retry of the train task."""

import functools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from trainyard.spec import JobSpec
from trainyard.training import preemption, usage
from trainyard.training.entry import STOPPED_ON_SIGTERM_EXIT
from trainyard.training.launchers import local
from trainyard.training.launchers.local import torchrun_argv, worker_env

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
EVERY = 10


def _config(tmp_path, prepared, name, spec: JobSpec | None = None) -> str:
    spec = (spec or _spec()).model_dump(mode="json")
    out = tmp_path / name
    out.mkdir(parents=True)
    cfg = out / "run.json"
    cfg.write_text(json.dumps({"spec": spec, "data": prepared.model_dump(mode="json"), "out_dir": str(out)}))
    return str(cfg)


def _run(argv, on_line=None, timeout=900, env=None):
    proc = subprocess.Popen(
        argv,
        env={**worker_env(2), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    # A hung group must fail the test, not the CI run: kill the whole process group at the deadline.
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if on_line:
                on_line(proc, line)
        rc = proc.wait()
    finally:
        timer.cancel()
    assert rc != -signal.SIGKILL, f"training hung for {timeout}s:\n" + "\n".join(lines[-30:])
    return rc, lines


def _workers(torchrun: subprocess.Popen) -> list[psutil.Process]:
    children = psutil.Process(torchrun.pid).children(recursive=True)
    return [
        p
        for p in children
        if "trainyard.training.entry" in " ".join(p.cmdline()) and "torch.distributed.run" not in " ".join(p.cmdline())
    ]


def _spec(strategy: str = "ddp") -> JobSpec:
    return JobSpec.model_validate(
        {
            "hyperparameters": {"epochs": 4, "batch_size": 16, "learning_rate": 0.05, "seed": 11},
            "distributed": {"max_restarts": 1, "strategy": strategy},
            "checkpointing": {"every_steps": EVERY, "keep_last": 3},
            "resources": {"gpus_per_node": 2},
        }
    )


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, prepared) -> dict:
    """An uninterrupted 2-worker run's result record, and a checkpoint step in its second epoch (not its end)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    rc, clean = _run(torchrun_argv(2, _config(tmp, prepared, "clean"), max_restarts=1))
    assert rc == 0, "\n".join(clean[-30:])
    result = json.loads((tmp / "clean" / "train_result.json").read_text())
    per_epoch = result["steps"] // 4
    target = next(s for s in range(EVERY, result["steps"], EVERY) if s > per_epoch + 3 and s % per_epoch)
    return {**result, "steps_per_epoch": per_epoch, "mid_epoch_checkpoint": target}


def test_sigkill_of_a_worker_mid_epoch_resumes(tmp_path, prepared, baseline):
    steps_per_epoch, target = baseline["steps_per_epoch"], baseline["mid_epoch_checkpoint"]

    killed = {}

    def chaos(proc, line):
        if not killed and f"saved at step {target}" in line:
            victim = max(_workers(proc), key=lambda p: p.pid)  # one worker, not the agent
            killed.update(pid=victim.pid, after_checkpoint=target)
            os.kill(victim.pid, signal.SIGKILL)

    rc, chaotic = _run(torchrun_argv(2, _config(tmp_path, prepared, "chaos"), max_restarts=1), chaos)
    text = "\n".join(chaotic)
    assert killed, "the kill never happened:\n" + text[-3000:]
    assert rc == 0, text[-3000:]
    resumed = [ln for ln in chaotic if "resumed from checkpoint" in ln]
    assert resumed, text[-3000:]
    resumed_step = int(resumed[-1].split(" at step ")[1].split()[0])
    # At most one checkpoint interval is lost: the restart continues from the last checkpoint seen.
    assert resumed_step >= killed["after_checkpoint"]
    assert resumed_step % steps_per_epoch > 0  # mid-epoch: the data position was restored
    result = json.loads((tmp_path / "chaos" / "train_result.json").read_text())
    assert result["steps"] == baseline["steps"]
    assert abs(result["val_accuracy"] - baseline["val_accuracy"]) <= 0.01


def test_sigterm_to_one_worker_stops_both_at_one_step_checkpointed_and_the_next_try_resumes_there(
    tmp_path, prepared, baseline
):
    """SIGTERM to one of two workers (the word of a preemption as Kubernetes gives it to a pod, whose
    environment asks for it): the rank that did not hear it stops too, at the same step (one all-reduced
    flag), with a checkpoint there; the workers end with status 3 (in a pod, a stop is no finished training:
    torchrun, out of restarts, ends non-zero), and the next try resumes at that step."""
    target = baseline["mid_epoch_checkpoint"]
    config = _config(tmp_path, prepared, "preempted")
    told = {}

    def preempt(proc, line):
        if not told and f"saved at step {target}" in line:
            victim = max(_workers(proc), key=lambda p: p.pid)
            told.update(pid=victim.pid)
            os.kill(victim.pid, signal.SIGTERM)

    rc, first = _run(torchrun_argv(2, config), preempt, env={preemption.ON_SIGTERM_ENV: "1"})  # as in a pod
    text = "\n".join(first)
    assert rc != 0 and f"failed (exitcode: {STOPPED_ON_SIGTERM_EXIT})" in text, text[-3000:]
    stopped = preemption.stopped_at(str(tmp_path / "preempted"))
    assert told and stopped is not None and stopped > target, text[-3000:]
    assert f"preempted: every worker stops at step {stopped}, checkpointed" in text
    assert f"saved at step {stopped}" in text  # a checkpoint of its own, between two periodic ones
    assert not (tmp_path / "preempted" / "train_result.json").exists()  # no model from a stopped try

    preemption.clear(str(tmp_path / "preempted"))
    rc, second = _run(torchrun_argv(2, config))
    text = "\n".join(second)
    assert rc == 0, text[-3000:]
    assert f"at step {stopped}" in next(ln for ln in second if "resumed from checkpoint" in ln)
    result = json.loads((tmp_path / "preempted" / "train_result.json").read_text())
    assert result["steps"] == baseline["steps"]
    assert abs(result["val_accuracy"] - baseline["val_accuracy"]) <= 0.01


def test_airflow_retry_resumes_from_the_checkpoint(trainyard_home, monkeypatch, capfd, caplog):
    if not os.environ.get("AIRFLOW_HOME"):
        pytest.fail("AIRFLOW_HOME is not set: run the suite with `make test`")
    sys.path.insert(0, str(REPO / "dags"))
    from train_pipeline import train_pipeline_dag as dag

    monkeypatch.setenv("TRAINYARD_FAIL_ONCE_AT_STEP", "30")
    dr = dag.test(
        run_conf={
            "hyperparameters": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1, "seed": 2},
            "distributed": {"max_restarts": 0},
            "checkpointing": {"every_steps": EVERY},
            "gates": [{"metric": "val_accuracy", "min": 0.5}],
        }
    )
    # The task log reaches stdout or the logging capture, depending on how earlier tests set up logging.
    out = capfd.readouterr().out + caplog.text
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    assert dr.state == "success", {t: ti.state for t, ti in tis.items()}
    assert tis["train"].try_number == 2
    assert "fault injection: crashing at step 30" in out
    assert "resumed from checkpoint step-00000030.pt at step 30" in out
    markers = list((trainyard_home / "runs").rglob(".fault-injected-30"))
    assert len(markers) == 1
    result = json.loads((markers[0].parent / "train_result.json").read_text())
    assert result["steps"] == 3 * 23 and result["resumed_from_step"] == 30


@pytest.mark.parametrize("strategy", ["ddp", "horovod", "deepspeed"])
def test_a_preempted_launch_ends_at_a_checkpoint_and_the_next_launch_resumes_there(
    trainyard_home, tmp_path, prepared, baseline, strategy
):
    """The launcher's side, for each built-in strategy: once the preemption's word is set, the workers are
    told (the word file) and end at one step they agree on, checkpointed; the launch raises Preempted
    naming that step, records its try (its GPU time is counted once), and the next launch resumes there
    and finishes the run."""
    target = baseline["mid_epoch_checkpoint"]
    run_dir = tmp_path / "run"
    config = _config(run_dir, prepared, "work", _spec(strategy))  # in its work directory, as the task writes it
    word = threading.Event()

    def on_line(line):
        if f"saved at step {target}" in line:
            word.set()

    launch = functools.partial(local.launch, _spec(strategy), prepared, run_dir=str(run_dir), config_path=config)
    with pytest.raises(local.Preempted, match=r"its workers stopped at step \d+ with a checkpoint there") as raised:
        launch(on_line=on_line, preemption=local.Preemption(word, grace_s=60))
    assert raised.value.step is not None and raised.value.step > target
    assert len(usage.tries(run_dir)) == 1
    lines = []
    launch(on_line=lines.append, preemption=local.Preemption(threading.Event(), grace_s=60))
    assert f"at step {raised.value.step}" in next(ln for ln in lines if "resumed from checkpoint" in ln)
    assert json.loads((run_dir / "work" / "train_result.json").read_text())["steps"] == baseline["steps"]
    assert [t["attempt"] for t in usage.tries(run_dir)] == [1, 2]
