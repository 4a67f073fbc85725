"""Local launcher: the strategy's launcher (torchrun for ddp, deepspeed and the custom command;
horovodrun for horovod) as a subprocess of the task, its output streamed line by line.

:func:`launch` is the pipeline's entry point: plan (:func:`~trainyard.training.launchers.command.local_command`
on this machine's facts), launch (:func:`run`), collect (one usage record for this try, always).

Every launch holds its workers to the job's CPU, memory and process limits
(:mod:`~trainyard.training.launchers.limits`): in the sandbox's cgroup, or, for a built-in trainer's workers
outside the sandbox, in a cgroup of their own where the worker is root; the task log says which limit is not
enforced and why. Workers stopped by a limit fail the task with
:class:`~trainyard.training.launchers.limits.LimitReached`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard import paths
from trainyard.errors import RetryableError
from trainyard.spec import JobSpec
from trainyard.training.launchers import limits, sandbox
from trainyard.training.launchers.base import (
    Interval,
    Launcher,
    MaxHoursReached,
    this_host_cores,
    time_left,
    worker_env,
)
from trainyard.training.launchers.command import Command, Host, local_command, torchrun_argv
from trainyard.training.metrics import LiveRelay
from trainyard.training.run_config import RunConfig, work_dir

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

__all__ = [
    "LaunchError",
    "LocalLauncher",
    "MaxHoursReached",
    "WorkersStopped",
    "launch",
    "run",
    "this_host",
    "torchrun_argv",
    "worker_env",
]


class LaunchError(RetryableError):
    """The workers exited non-zero; a retry resumes from the newest checkpoint."""


class WorkersStopped(LaunchError):
    """The workers were stopped by the ``stop`` event (a lost admission, a sweep trial's pruner), not
    ended of themselves."""


def this_host(devices: list[str] | None = None) -> Host:
    """The facts of this machine a local command depends on (the only impure part of planning). With
    ``devices`` (the GPUs a job was given), the job sees those alone: CUDA_VISIBLE_DEVICES."""
    import torch

    from trainyard.scheduling.resources import resources_in_force

    cpu = resources_in_force().gpu_types.get("cpu")
    env = dict(os.environ)
    # torch.compile's caches of the platform's own workers in trainyard's private cache, never in the
    # shared /tmp, where another user (a sandboxed custom command) could plant code for them to load
    # trainyard's home named: the workers find a recipe's input files there, and their working directory
    # (work/ in the sandbox) is not where the default home would be
    env.setdefault("TRAINYARD_HOME", str(paths.home()))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(paths.cache_root() / "torchinductor"))
    env.setdefault("TRITON_CACHE_DIR", str(paths.cache_root() / "triton"))
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return Host(
        cuda_devices=len(devices)
        if devices is not None
        else (torch.cuda.device_count() if torch.cuda.is_available() else 0),
        cores=this_host_cores(),
        env=env,
        cpu_slots=cpu.count if cpu else 0,
    )


# In the run directory once a try has run sandboxed: what that try's workers wrote (a checkpoint is a
# pickle) is never loaded by a later try that would run as the task's own user.
SANDBOXED_MARK = "sandboxed"


@dataclass(frozen=True)
class LocalPlan:
    command: Command
    run_dir: str
    timeout_s: float  # what is left of resources.max_hours after the run's earlier tries
    readable: tuple[str, ...] = ()  # what the workers read: the prepared data, the run config, recipe inputs
    unsandboxed_because: str | None = None  # why a built-in trainer's workers run as the task's own user
    relay_to_run: str | None = None  # the MLflow run the metrics file is relayed to while the workers run
    tensorboard_dir: str | None = None
    limits: limits.HostLimits | None = None  # the job's CPU, memory and process limits (None: none asked)

    @property
    def sandboxed(self) -> bool:
        """Run as a sandbox user (trainyard.training.launchers.sandbox)."""
        return self.unsandboxed_because is None


class LocalLauncher(Launcher):
    where = "local"

    def __init__(self, host: Host | None = None) -> None:
        self.host = host
        self.workers_started: float | None = None  # once a sandbox user is had: the try's GPU time starts

    def plan(self, spec: JobSpec, data: PreparedData, *, run_dir: str, config_path: str) -> LocalPlan:
        """MaxHoursReached if the run's earlier tries used all of ``resources.max_hours``; SpecError if its
        team's policy does not allow it (checked again here, where the command is started).

        The workers run in the sandbox: a custom command always (SandboxUnavailable where there is none), a
        built-in trainer's wherever this host has one (elsewhere as the task's user, and the log says why)."""
        from trainyard import recipes
        from trainyard.scheduling.resources import resources_in_force
        from trainyard.teams import check_policy

        # the inventory the queue admitted the job under: an edit that broke the file does not fail it
        resources = resources_in_force()
        check_policy(spec, resources)
        if spec.recipe == "custom":
            sandbox.require()
            why, readable = None, [data.path]
        else:
            why = sandbox.unavailable_reason()
            if why and (Path(run_dir) / SANDBOXED_MARK).exists():
                raise sandbox.SandboxError(
                    f"an earlier try of this run ran in the sandbox, so its work/ files (checkpoints) were "
                    f"written by a sandbox user, and they are resumed only inside one; this host cannot sandbox "
                    f"now: {why}"
                )
            readable = [data.path, config_path, *map(str, recipes.worker_inputs(spec))]
        left = time_left(spec, run_dir)
        cfg = RunConfig.load(config_path) if Path(config_path).is_file() else None
        command = local_command(
            spec,
            self.host or this_host(),
            config_path=config_path,
            data_dir=data.path,
            run_dir=run_dir,
            trial=cfg is not None and cfg.trial_objective is not None,
        )
        return LocalPlan(
            command,
            run_dir,
            left,
            readable=tuple(readable),
            unsandboxed_because=why,
            relay_to_run=cfg.mlflow_run_id if cfg and cfg.metrics_file else None,
            tensorboard_dir=cfg.tensorboard_dir if cfg else None,
            limits=limits.job_limits(spec, resources),
        )

    def launch(self, plan: LocalPlan, on_line: Callable[[str], None], stop: threading.Event | None = None) -> None:
        with self._relay(plan, on_line):
            if not plan.sandboxed:
                on_line(f"sandbox: none on this host, the workers run as this task's user: {plan.unsandboxed_because}")
                self._launch_unsandboxed(plan, on_line, stop)
                return
            Path(plan.run_dir, SANDBOXED_MARK).touch()
            with sandbox.Sandbox(work_dir(plan.run_dir), readable=plan.readable, host_limits=plan.limits) as box:
                assert box.user is not None
                on_line(f"sandbox: running as {box.user.name} (uid {box.user.uid})")
                if box.enforcement is not None:
                    nproc = box.enforcement.limits.processes
                    fallback = f"; the sandbox user's RLIMIT_NPROC {nproc} holds them instead"
                    for line in box.enforcement.log_lines(fallback):
                        on_line(line)
                self.workers_started = time.time()
                with _naming_the_limit(box.limit_reached):
                    run(
                        box.command(plan.command.argv),
                        env=box.env(plan.command.env),
                        on_line=on_line,
                        timeout_s=plan.timeout_s,
                        after_exit=box.stop,
                        stop=stop,
                    )

    def _launch_unsandboxed(
        self, plan: LocalPlan, on_line: Callable[[str], None], stop: threading.Event | None
    ) -> None:
        """The workers as this task's user, in a cgroup of their own where this worker can make one."""
        argv, held = plan.command.argv, None
        if plan.limits is not None:
            limits.remove_leftovers("task")  # what a crashed task's launch left
            held = limits.create(f"task{os.getpid()}-{secrets.token_hex(4)}", plan.limits)
            for line in held.log_lines():
                on_line(line)
        cgroup = held.cgroup if held else None
        if cgroup is not None:
            argv = sandbox.joined(argv, cgroup)
        self.workers_started = time.time()
        try:
            with _naming_the_limit(lambda: cgroup.breaches(held.limits) if cgroup and held else None):
                run(argv, env=plan.command.env, on_line=on_line, timeout_s=plan.timeout_s, stop=stop)
        finally:
            if cgroup is not None:
                try:
                    cgroup.remove()
                except limits.CgroupError as err:  # what the workers left runs on; a later launch removes it
                    on_line(f"limits: {err}")

    @staticmethod
    def _relay(plan: LocalPlan, on_line: Callable[[str], None]) -> contextlib.AbstractContextManager:
        """The metrics file relayed to the run's MLflow run and TensorBoard while the workers run."""
        if not plan.relay_to_run:
            return contextlib.nullcontext()
        from trainyard.tracking import mlflow_tracking as mt

        return LiveRelay(plan.run_dir, mt.client(), plan.relay_to_run, plan.tensorboard_dir, on_line)

    def collect(self, plan: LocalPlan, observed: Interval | None) -> Interval | None:
        return observed  # the subprocess's lifetime is the time its workers held the GPUs


def launch(
    spec: JobSpec,
    data: PreparedData,
    *,
    run_dir: str,
    config_path: str,
    on_line: Callable[[str], None],
    devices: list[str] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run ``spec``'s workers on this machine (on ``devices``, when the job was given some) and wait, or
    stop them once ``stop`` is set (the job lost its admission); append this try's usage record whatever
    happens.

    A spec this machine cannot run (more GPUs than it has) fails before anything starts and records
    nothing."""
    launcher = LocalLauncher(this_host(devices) if devices is not None else None)
    plan = launcher.plan(spec, data, run_dir=run_dir, config_path=config_path)
    on_line("launching: " + " ".join(plan.command.argv))
    try:
        launcher.launch(plan, on_line, stop)
    finally:
        # from the workers' start: waiting for a free sandbox user holds the job's GPUs, but is not its use
        started = launcher.workers_started
        if started is not None:
            launcher.record(spec, run_dir, launcher.collect(plan, Interval(started, time.time())))


@contextlib.contextmanager
def _naming_the_limit(reached: Callable[[], limits.LimitReached | None]):
    """Workers that failed after a limit stopped some of their processes fail with that limit's error."""
    try:
        yield
    except WorkersStopped:
        raise
    except LaunchError as err:
        hit = reached()
        if hit is not None:
            raise hit from err
        raise


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it if it is still there after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class _Watch:
    """What ends or follows a child besides its own exit: ``after_exit`` once it has ended (an error it
    raises is kept in ``failed``), ``stop`` once set, and the timer of ``timeout_s`` (``timed_out``)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        timeout_s: float | None,
        after_exit: Callable[[], None] | None,
        stop: threading.Event | None,
    ) -> None:
        self.proc, self.after_exit, self.stop = proc, after_exit, stop
        self.timed_out = threading.Event()
        self.failed: list[BaseException] = []
        self.watcher = threading.Thread(target=self._then, name="launch-after-exit", daemon=True)
        if after_exit is not None:
            self.watcher.start()
        if stop is not None:
            threading.Thread(target=self._stop_when_told, name="launch-stop", daemon=True).start()
        self.timer = threading.Timer(timeout_s, self._expire) if timeout_s is not None else None
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def _then(self) -> None:
        self.proc.wait()
        try:
            self.after_exit()  # type: ignore[misc]
        except BaseException as err:  # raised by run(), once the output is read
            self.failed.append(err)

    def _stop_when_told(self) -> None:
        while self.proc.poll() is None:
            if self.stop.wait(1.0):  # type: ignore[union-attr]
                _stop(self.proc)
                return

    def _expire(self) -> None:
        self.timed_out.set()
        _stop(self.proc)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.watcher.is_alive():
            self.watcher.join()  # what the child left is gone before the caller goes on (and gives the user back)


def run(
    argv: list[str],
    *,
    env: dict | None = None,
    on_line: Callable[[str], None] = print,
    tail: int = 40,
    timeout_s: float | None = None,
    after_exit: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run ``argv``, pass every output line to ``on_line``, raise LaunchError with the last lines on failure,
    MaxHoursReached if it still runs after ``timeout_s``. ``after_exit``: called once the child itself has
    ended (the sandbox kills what it left: a daemon holding the output open would block the reading).
    ``stop``: once set, the child is stopped as on a timeout (and this raises LaunchError).

    The child gets its own process group, which is killed if this call is interrupted (task timeout,
    "mark failed") or times out, so no orphaned workers keep the GPUs."""
    last: deque[str] = deque(maxlen=tail)
    proc = subprocess.Popen(
        argv,
        env=env,
        # Under Airflow's executor this task's stdin is its supervisor's request socket: the workers get
        # /dev/null instead, and close_fds (on by default, kept explicit) drops every other inherited descriptor
        stdin=subprocess.DEVNULL,
        close_fds=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    watch = _Watch(proc, timeout_s, after_exit, stop)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            last.append(line)
            on_line(line)
        rc = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    finally:
        watch.close()
    if watch.failed:
        raise watch.failed[0]
    if watch.timed_out.is_set() and rc != 0:  # not a run that ended by itself as the time ran out
        hours = (timeout_s or 0) / 3600
        raise MaxHoursReached(
            f"resources.max_hours: the workers were stopped after {hours:.3g} hour(s), what was left of the "
            f"run's max_hours; raise it to train longer (the newest checkpoint is kept)"
        )
    if stop is not None and stop.is_set():  # whatever the workers exited with, they did not finish
        raise WorkersStopped(f"{' '.join(argv[:3])} was stopped (exit status {rc}); last lines:\n" + "\n".join(last))
    if rc != 0:
        raise LaunchError(f"{' '.join(argv[:3])} exited with {rc}; last lines:\n" + "\n".join(last))
