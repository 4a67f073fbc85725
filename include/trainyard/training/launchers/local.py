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
import dataclasses
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
from trainyard.errors import Preempted, RetryableError
from trainyard.spec import JobSpec
from trainyard.training import preemption as preempting
from trainyard.training.launchers import limits, sandbox
from trainyard.training.launchers.base import (
    Interval,
    Launcher,
    MaxHoursReached,
    this_host_cores,
    time_left,
    worker_env,
)
from trainyard.training.launchers.command import Command, Host, NodePlace, local_command, torchrun_argv
from trainyard.training.metrics import LiveRelay
from trainyard.training.preemption import GRACE_ENV
from trainyard.training.run_config import RunConfig, work_dir

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

__all__ = [
    "LaunchError",
    "LocalLauncher",
    "MaxHoursReached",
    "Preempted",
    "Preemption",
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


@dataclass(frozen=True, eq=False)  # holds an event: handed on, never compared
class Preemption:
    """The word that the job is preempted (``word``, set by its admission's lease) and the seconds its
    workers have from then to checkpoint and end (``grace_s``) before they are killed."""

    word: threading.Event
    grace_s: float


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
# Why a node of a multi-node job runs its workers as the task's user: the sandbox's network is loopback only,
# and its work/ directory is its one user's, while the nodes reach each other and every rank reads the
# checkpoints rank 0 writes (docs/security.md).
AMONG_NODES = (
    "a node of a multi-node job reaches the other nodes over this host's network and reads the checkpoints "
    "node 0 writes, which the sandbox (loopback only, work/ its one user's) does not allow"
)


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
    custom: bool = False  # a custom program (told of a preemption by SIGTERM), not a built-in trainer
    first_node: bool = True  # node 0 of a multi-node job, or a job's one node: it relays, and owns the word's files

    @property
    def sandboxed(self) -> bool:
        """Run as a sandbox user (trainyard.training.launchers.sandbox)."""
        return self.unsandboxed_because is None


class LocalLauncher(Launcher):
    where = "local"

    def __init__(self, host: Host | None = None) -> None:
        self.host = host
        self.workers_started: float | None = None  # once a sandbox user is had: the try's GPU time starts

    def plan(
        self, spec: JobSpec, data: PreparedData, *, run_dir: str, config_path: str, node: NodePlace | None = None
    ) -> LocalPlan:
        """MaxHoursReached if the run's earlier tries used all of ``resources.max_hours``; SpecError if its
        team's policy does not allow it (checked again here, where the command is started). ``node``: where
        this node stands among a multi-node job's (node 0 relays the metrics; the others only train).

        The workers run in the sandbox: a custom command always (SandboxUnavailable where there is none), a
        built-in trainer's wherever this host has one (elsewhere as the task's user, and the log says why),
        but for a node of a multi-node job (:data:`AMONG_NODES`)."""
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
            why = AMONG_NODES if spec.resources.nodes > 1 else sandbox.unavailable_reason()
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
            node=node,
        )
        first_node = node is None or node.index == 0
        relays = cfg is not None and bool(cfg.metrics_file) and first_node
        return LocalPlan(
            command,
            run_dir,
            left,
            readable=tuple(readable),
            unsandboxed_because=why,
            relay_to_run=cfg.mlflow_run_id if cfg and relays else None,
            tensorboard_dir=cfg.tensorboard_dir if cfg else None,
            limits=limits.job_limits(spec, resources),
            custom=spec.recipe == "custom",
            first_node=first_node,
        )

    def launch(
        self,
        plan: LocalPlan,
        on_line: Callable[[str], None],
        stop: threading.Event | None = None,
        preemption: Preemption | None = None,
    ) -> None:
        """Run the plan's workers; stop them once ``stop`` is set; with ``preemption``, tell them once its word
        is set and give them its grace (Preempted, unless they had finished)."""
        work = work_dir(plan.run_dir)
        told = None
        if preemption is not None:
            if plan.first_node:  # no word or record of an earlier try (the other nodes share the run's work/)
                preempting.clear(work)
            told = _Told(preemption, _word_for(plan), on_line)
            plan = dataclasses.replace(
                plan, command=Command(plan.command.argv, {**plan.command.env, GRACE_ENV: f"{preemption.grace_s:g}"})
            )
        try:
            self._launch(plan, on_line, stop, told)
        except Preempted as preempted:
            assert told is not None  # raised only once told
            if not told.killed.is_set() and _finished(plan, told.since):
                # the word came as the workers finished: their result stands
                on_line("preempted as the training ended: its result stands")
                return
            if not plan.custom and not told.killed.is_set() and preempting.stopped_at(work) is None:
                raise LaunchError(
                    f"the workers failed after the word to stop, not on it: {preempted}; last lines:\n"
                    + "\n".join(preempted.last if isinstance(preempted, _EndedWhenTold) else [])
                ) from None
            raise _preempted(plan, told, preempted) from None

    def _launch(
        self, plan: LocalPlan, on_line: Callable[[str], None], stop: threading.Event | None, told: _Told | None
    ) -> None:
        with self._relay(plan, on_line):
            if not plan.sandboxed:
                on_line(f"sandbox: none on this host, the workers run as this task's user: {plan.unsandboxed_because}")
                self._launch_unsandboxed(plan, on_line, stop, told)
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
                        told=told,
                    )

    def _launch_unsandboxed(
        self, plan: LocalPlan, on_line: Callable[[str], None], stop: threading.Event | None, told: _Told | None
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
                run(argv, env=plan.command.env, on_line=on_line, timeout_s=plan.timeout_s, stop=stop, told=told)
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
    preemption: Preemption | None = None,
    node: NodePlace | None = None,
) -> None:
    """Run ``spec``'s workers on this machine (on ``devices``, when the job was given some) and wait, or
    stop them once ``stop`` is set (the job lost its admission), or tell them to checkpoint and end once
    ``preemption``'s word is set (Preempted); append this try's usage record whatever happens (``node``:
    this node's of a multi-node job, with its GPUs).

    A spec this machine cannot run (more GPUs than it has) fails before anything starts and records
    nothing."""
    launcher = LocalLauncher(this_host(devices) if devices is not None else None)
    plan = launcher.plan(spec, data, run_dir=run_dir, config_path=config_path, node=node)
    on_line("launching: " + " ".join(plan.command.argv))
    try:
        launcher.launch(plan, on_line, stop, preemption)
    finally:
        # from the workers' start: waiting for a free sandbox user holds the job's GPUs, but is not its use
        started = launcher.workers_started
        if started is not None:
            interval = launcher.collect(plan, Interval(started, time.time()))
            launcher.record(spec, run_dir, interval, node=None if node is None else node.index)


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


class _EndedWhenTold(Preempted):
    """:func:`run`'s word that the workers ended after a preemption's word (with their exit status and last
    lines): the launcher says what that was."""

    def __init__(self, rc: int, last: list[str]) -> None:
        super().__init__(f"exit status {rc}")
        self.last = last


class _Told:
    """A preemption as one launch follows it: how its workers are told (``tell``, given the launcher's
    process), whether they were (``told``: the word came while they ran) and killed after the grace."""

    def __init__(
        self, preemption: Preemption, tell: Callable[[subprocess.Popen], None], on_line: Callable[[str], None]
    ) -> None:
        self.preemption, self.tell, self.on_line = preemption, tell, on_line
        self.since = time.time()  # the launch's start: what its workers write is newer
        self.told, self.killed = threading.Event(), threading.Event()

    def follow(self, proc: subprocess.Popen) -> None:
        """Once the word is set: tell the workers, give them the grace, kill them after it."""
        while proc.poll() is None:
            if self.preemption.word.wait(1.0):
                self.told.set()
                try:
                    self.tell(proc)
                except OSError as err:  # they are not told: the grace runs out and they are killed
                    self.on_line(f"preempted: could not tell the workers ({err}); they are killed after the grace")
                try:
                    proc.wait(timeout=self.preemption.grace_s)
                except subprocess.TimeoutExpired:  # the grace was theirs: killed now, not told again
                    self.killed.set()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                return


def _word_for(plan: LocalPlan) -> Callable[[subprocess.Popen], None]:
    """How a plan's workers hear the word: a custom program gets SIGTERM (its launcher's process group);
    the built-in trainers' workers the word file in their work directory (trainyard.training.preemption:
    a signal would reach torchrun too, which kills its workers 30 s after one of its own, and their DataLoader
    processes)."""
    if plan.custom:

        def sigterm(proc: subprocess.Popen) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

        return sigterm
    work = work_dir(plan.run_dir)
    return lambda proc: preempting.say_word(work)


def _finished(plan: LocalPlan, since: float) -> bool:
    """Whether a built-in trainer's workers ended with their result (a train_result.json written since
    ``since``, the launch's start) and not on the word: told as they finished, they finished. A custom
    program told is taken as stopped by it."""
    work = work_dir(plan.run_dir)
    if plan.custom or preempting.stopped_at(work) is not None:
        return False
    result = preempting.regular_file(Path(work, "train_result.json"))
    return result is not None and result.st_mtime >= since


def _preempted(plan: LocalPlan, told: _Told, error: Preempted) -> Preempted:
    """The launch's Preempted, saying where the next try resumes."""
    grace = told.preemption.grace_s
    step = None if plan.custom else preempting.stopped_at(work_dir(plan.run_dir))
    if told.killed.is_set():
        said = f"its workers did not end within the {grace:g} s grace and were killed; it resumes from its newest "
        said += "checkpoint"
    elif step is not None:
        said = f"its workers stopped at step {step} with a checkpoint there; it resumes at that step"
    elif plan.custom:
        said = f"its program ended after SIGTERM ({error}); it starts again with the same arguments"
    else:
        said = f"its workers ended without stopping on the word ({error}); it resumes from its newest checkpoint"
    return Preempted(f"preempted: {said}, once it is admitted again", step)


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
        told: _Told | None = None,
    ) -> None:
        self.proc, self.after_exit, self.stop = proc, after_exit, stop
        self.timed_out = threading.Event()
        self.failed: list[BaseException] = []
        self.watcher = threading.Thread(target=self._then, name="launch-after-exit", daemon=True)
        if after_exit is not None:
            self.watcher.start()
        if stop is not None:
            threading.Thread(target=self._stop_when_told, name="launch-stop", daemon=True).start()
        if told is not None:
            threading.Thread(target=told.follow, args=(proc,), name="launch-preemption", daemon=True).start()
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
    told: _Told | None = None,
) -> None:
    """Run ``argv``, pass every output line to ``on_line``, raise LaunchError with the last lines on failure,
    MaxHoursReached if it still runs after ``timeout_s``. ``after_exit``: called once the child itself has
    ended (the sandbox kills what it left: a daemon holding the output open would block the reading).
    ``stop``: once set, the child is stopped as on a timeout (and this raises LaunchError). ``told``: a
    preemption's word, once set, is told to the child, which has its grace to end (Preempted).

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
    watch = _Watch(proc, timeout_s, after_exit, stop, told)
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
    if told is not None and told.told.is_set():  # the launcher decides whether they had finished
        raise _EndedWhenTold(rc, list(last))
    if stop is not None and stop.is_set():  # whatever the workers exited with, they did not finish
        raise WorkersStopped(f"{' '.join(argv[:3])} was stopped (exit status {rc}); last lines:\n" + "\n".join(last))
    if rc != 0:
        raise LaunchError(f"{' '.join(argv[:3])} exited with {rc}; last lines:\n" + "\n".join(last))
