"""The metrics file: how a local worker's curves reach MLflow and TensorBoard without the worker touching
either.

A worker (rank 0 of a built-in trainer, or a custom command) appends JSON lines to ``metrics.jsonl`` in
its run's ``work`` directory, one object per step: ``{"step": 12, "train_loss": 0.3, ...}``; every numeric
field but ``step`` is a metric (NaN and infinities included: a diverging curve must show). The launching
task, which runs as the platform and holds MLflow's store, relays what is new every few seconds
(:class:`LiveRelay`, local runs) and once more when it collects the run (:func:`relay`; a custom
program's pods on Kubernetes get only this pass): curves stay live, and the sandboxed worker never needs
MLflow's database, its credentials or the TensorBoard tree.

How far the file has been relayed (its inode and byte offset) is kept beside the ``work`` directory
(:data:`RELAYED_FILE`, out of the worker's reach), so a retry or the final pass does not log a point again.
The file is append-only: one that was replaced or cut shorter is relayed again from its start (the log
says so). Delivery is at least once: a pass that fails between MLflow and recording the offset sends those
points again on the next pass.

The file is written by code the platform does not trust (a custom command; a built-in worker fed hostile
data): it is opened without following a link (:func:`~trainyard.training.run_config.open_untrusted`), and
a malformed line fails the run naming the file and line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from trainyard.errors import PermanentError
from trainyard.files import atomic_write
from trainyard.training.run_config import WorkerOutputError, open_untrusted, work_dir

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RELAYED_FILE = "metrics_relayed.json"  # in the run directory: what of the metrics file is relayed
READ_LIMIT = 8 << 20  # bytes read per pass: a huge file is relayed in pieces, never held whole
MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log_batch request
RELAY_NICE = 10  # the live relay thread's nice value

Point = tuple[int, str, float]  # (step, name, value)


def metrics_path(run_dir: str | Path) -> Path:
    return Path(work_dir(str(run_dir))) / METRICS_FILE


METRIC_NAME = re.compile(r"[\w./\- :]{1,250}")  # what MLflow accepts as a metric's name
STEP_MAX = 2**63 - 1  # MLflow keeps a step as a 64-bit integer


def parse_line(line: str | bytes, where: str) -> tuple[int, list[tuple[str, float]]]:
    """One line's step and its (name, value) metrics; WorkerOutputError naming ``where`` if it is not one
    (MLflow would refuse it: the relay would send its batch again and again)."""
    try:
        record = json.loads(line)
        step = int(record["step"])
        points = [
            (name, float(value))
            for name, value in record.items()
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as err:
        raise WorkerOutputError(f"{where}: expected a JSON object with an integer 'step' ({err})") from None
    if not 0 <= step <= STEP_MAX:
        raise WorkerOutputError(f"{where}: step {step} is out of range (0 to 2**63-1)")
    bad = [name for name, _ in points if not METRIC_NAME.fullmatch(name)]
    if bad:
        raise WorkerOutputError(
            f"{where}: metric names {bad} are not allowed (letters, digits, '_', '-', '.', '/', ' ', ':'; "
            "at most 250 characters)"
        )
    return step, points


def read_metrics(path: str | Path) -> list[Point]:
    """(step, name, value) for every numeric field of the whole file (none if there is no file)."""
    rows: list[Point] = []
    path = Path(path)
    with open_untrusted(path) as fd:
        if fd is None:
            return rows
        with os.fdopen(os.dup(fd), "rb") as fh:
            for lineno, line in enumerate(fh.read().split(b"\n"), start=1):
                if line.strip():
                    step, points = parse_line(line, f"{path}:{lineno}")
                    rows.extend((step, name, value) for name, value in points)
    return rows


def open_for_append(path: str | Path) -> IO[str]:
    """The metrics file for a worker to append to (created with its directory). A line a killed earlier
    try left half-written is cut off first: the next line would otherwise join it into a malformed one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        end = keep = fh.seek(0, os.SEEK_END)
        while keep > 0:  # back to just after the last newline, 64 KiB at a time
            start = max(0, keep - 65536)
            fh.seek(start)
            newline = fh.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        if keep != end:
            fh.truncate(keep)
    return open(path, "a", encoding="utf-8")  # noqa: SIM115 - the caller closes it


HEAD_BYTES = 4096  # the start of the file fingerprinted: a file rewritten from its start differs there


def _relayed(run_dir: Path) -> dict[str, Any]:
    try:
        raw = json.loads((run_dir / RELAYED_FILE).read_text())
        return {k: int(raw[k]) for k in ("inode", "offset", "lines")} | {"head": str(raw["head"])}
    except FileNotFoundError:
        return {"inode": 0, "offset": 0, "lines": 0, "head": ""}


def _head(fd: int, offset: int) -> str:
    """A fingerprint of the first bytes relayed (up to :data:`HEAD_BYTES` of the first ``offset``)."""
    return hashlib.sha256(os.pread(fd, min(offset, HEAD_BYTES), 0)).hexdigest()


def relay(
    run_dir: str | Path,
    client,
    run_id: str,
    tensorboard_dir: str | None = None,
    writer=None,
    on_line: Callable[[str], None] = print,
    final: bool = False,
) -> int:
    """Log the metrics file's complete lines not relayed yet to MLflow run ``run_id`` (and as TensorBoard
    scalars under ``tensorboard_dir``, through ``writer`` if given); returns how many points. Raises
    WorkerOutputError at a malformed line (what came before it is relayed and kept). ``final``: the
    workers have ended, so a last line without its newline is complete too."""
    run_dir = Path(run_dir)
    path = metrics_path(run_dir)
    state = _relayed(run_dir)
    total = 0
    while True:
        with open_untrusted(path) as fd:
            if fd is None:
                return total
            st = os.fstat(fd)
            at = state["offset"]
            if at and (st.st_ino != state["inode"] or st.st_size < at or _head(fd, at) != state["head"]):
                on_line(f"{path} was replaced or rewritten (it is append-only): relaying it again from its start")
                state = {"inode": st.st_ino, "offset": 0, "lines": 0, "head": ""}
                atomic_write(run_dir / RELAYED_FILE, json.dumps(state).encode())
            chunk = os.pread(fd, READ_LIMIT, state["offset"])
            unterminated = final and 0 < len(chunk) < READ_LIMIT and not chunk.endswith(b"\n")
            chunk += b"\n" if unterminated else b""
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next pass
            if end == 0:
                if len(chunk) == READ_LIMIT:
                    raise WorkerOutputError(f"{path}:{state['lines'] + 1}: a line longer than {READ_LIMIT} bytes")
                return total
            rows: list[Point] = []
            error: WorkerOutputError | None = None
            done, lines = 0, state["lines"]
            for raw in chunk[: end - 1].split(b"\n"):
                if raw.strip():
                    try:
                        step, points = parse_line(raw, f"{path}:{lines + 1}")
                    except WorkerOutputError as err:
                        error = err
                        break
                    rows.extend((step, name, value) for name, value in points)
                done += len(raw) + 1
                lines += 1
            log_points(rows, client, run_id, tensorboard_dir, writer)
            offset = state["offset"] + min(done, len(chunk) - unterminated)  # the newline added is not the file's
            state = {"inode": st.st_ino, "offset": offset, "lines": lines, "head": _head(fd, offset)}
        atomic_write(run_dir / RELAYED_FILE, json.dumps(state).encode())
        total += len(rows)
        if error is not None:
            raise error
        if len(chunk) < READ_LIMIT:  # the whole file was read; else a partial last line is read again
            return total


def log_points(
    rows: Iterable[Point], client, run_id: str | None, tensorboard_dir: str | None = None, writer=None
) -> None:
    """``rows`` to MLflow run ``run_id`` through ``client`` (``log_batch``, :data:`MLFLOW_BATCH` a call;
    none without a client) and as TensorBoard scalars: through ``writer``, or a writer of its own for
    ``tensorboard_dir`` (neither: none)."""
    rows = list(rows)
    if not rows:
        return
    if client is not None and run_id:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for step, name, value in rows]
        for start in range(0, len(batch), MLFLOW_BATCH):
            client.log_batch(run_id, metrics=batch[start : start + MLFLOW_BATCH])
    own = writer is None and bool(tensorboard_dir)
    if own:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(tensorboard_dir)
    if writer is None:
        return
    try:
        for step, name, value in rows:
            writer.add_scalar(tensorboard_tag(name), value, step)
    finally:
        writer.close() if own else writer.flush()


HISTOGRAMS_LIMIT = 256 << 20  # bytes of a run's histogram event files copied


def copy_histograms(run_dir: str | Path, tensorboard_dir: str | None) -> int:
    """The histogram event files rank 0 wrote in ``work/tensorboard`` (a local worker) beside the run's
    scalars in ``tensorboard_dir``, where TensorBoard reads them as one run; read as untrusted (a regular
    file of its own each; past :data:`HISTOGRAMS_LIMIT` bytes in all, the rest stay behind). How many."""
    if not tensorboard_dir:
        return 0
    source = Path(work_dir(str(run_dir))) / "tensorboard"
    if not source.is_dir() or source.is_symlink():
        return 0
    target = Path(tensorboard_dir)
    copied, budget = 0, HISTOGRAMS_LIMIT
    for path in sorted(source.glob("events.out.tfevents.*")):
        with open_untrusted(path) as fd:
            if fd is None:
                continue
            size = os.fstat(fd).st_size
            if size > budget:  # the run's outcome does not hang on its histograms: the rest stay behind
                log.warning(
                    "%s: histogram files over %d MiB in all; the rest are not copied", source, HISTOGRAMS_LIMIT >> 20
                )
                break
            budget -= size
            data = os.pread(fd, size, 0)
        atomic_write(target / f"{path.name}.histograms", data)
        copied += 1
    return copied


def tensorboard_tag(name: str) -> str:
    """``train_loss`` -> ``train/loss``: TensorBoard groups a run's curves by the part before the slash."""
    return name.replace("_", "/", 1)


class LiveRelay:
    """:func:`relay` every ``every_s`` seconds on a thread while the workers run (``with LiveRelay(...):``).
    The thread runs at nice ``RELAY_NICE`` and makes the TensorBoard writer itself, so the writer's own
    thread (it serialises and writes each event) inherits the nice value too; entering waits for the
    writer, so a tree it cannot write fails the run before the workers start. A failed pass (MLflow away
    for a moment) is printed through ``on_line`` and tried again at the next; a malformed file stops the
    relaying, and the collect step's pass raises it."""

    def __init__(
        self,
        run_dir: str | Path,
        client,
        run_id: str,
        tensorboard_dir: str | None,
        on_line: Callable[[str], None],
        every_s: float = 5.0,
    ) -> None:
        self.run_dir, self.client, self.run_id, self.tensorboard_dir = Path(run_dir), client, run_id, tensorboard_dir
        self.on_line, self.every_s = on_line, every_s
        self._stop = threading.Event()
        self._started = threading.Event()  # the thread has its nice value and its writer (or failed to)
        self._start_error: BaseException | None = None
        self._aborted = False  # entering was interrupted: the thread ends without relaying
        self._thread = threading.Thread(target=self._run, name="trainyard-metrics-relay", daemon=True)
        self._writer: Any = None  # TensorBoard's SummaryWriter

    def __enter__(self) -> LiveRelay:
        if self.tensorboard_dir:  # imported here, at the caller's priority: only the writer is made niced
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        self._thread.start()
        try:
            self._started.wait()
        except BaseException:  # interrupted (the task is being killed): no thread left behind
            self._aborted = True
            self._stop.set()
            self._thread.join()
            self._close_writer()
            raise
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()  # its last pass ends before the collect step's, never beside it
        self._close_writer()

    def _close_writer(self) -> None:
        if self._writer is None:
            return
        try:
            self._writer.close()
        except Exception as err:  # noqa: BLE001 - reported, not raised over the run's own outcome
            self.on_line(f"metrics relay: the TensorBoard writer did not close: {type(err).__name__}: {err}")

    def _run(self) -> None:
        # The relay is never in a hurry: this thread and the writer's it starts (Linux schedules threads as
        # tasks, and a new one inherits its creator's nice value) weigh about a tenth of a nice-0 thread
        # of the same scheduling group. The local launcher starts the workers in a session of their own,
        # which is a group of its own where the kernel's autogroup is on: against them it is then the
        # task process's group that counts, and that is all but idle beside this thread.
        try:
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RELAY_NICE)
            if self.tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(self.tensorboard_dir)
        except BaseException as err:  # noqa: BLE001 - raised by __enter__ in the caller's thread
            self._start_error = err
            return
        finally:
            self._started.set()
        last_error = ""
        while True:
            stopping = self._stop.wait(self.every_s)
            if self._aborted:  # entering was interrupted (set before the stop): no pass, not even the last
                return
            try:
                relay(self.run_dir, self.client, self.run_id, self.tensorboard_dir, self._writer, self.on_line)
                last_error = ""
            except PermanentError as err:
                self.on_line(f"metrics relay stopped: {err}")
                return
            except Exception as err:  # noqa: BLE001 - a store away for a moment: the next pass tries again
                message = f"{type(err).__name__}: {err}"
                if message != last_error:  # once per kind of failure, not every few seconds
                    self.on_line(f"metrics relay failed, trying again: {message}")
                last_error = message
            if stopping:
                return
