"""Rank 0's metric sink, kept off the training step, written by a background thread: the run's metrics file
(every platform run, local or in pods: the launching or collecting task relays it to MLflow and
TensorBoard, :mod:`trainyard.training.metrics`), or, for a run config that names no metrics file (a
benchmark's), MLflow (``log_batch``) and TensorBoard themselves.

The step only appends to a bounded queue (``put_nowait``: it never waits on SQLite, a tracking server or
the disk). With a metrics file the thread only opens it; writing to MLflow / TensorBoard itself, it
imports them while the worker loads its data and builds its model, and the loop starts once they are in
(:meth:`Tracker.wait_ready`): an import holds the GIL for seconds, and each of the step's small torch
calls must take the GIL back, so an import beside the loop ran the digits recipe at a fifth of its speed.
The thread sleeps while the loop's windows gather in the queue, and wakes once every ``every_s`` seconds
(sooner when the queue is half full): it takes them all, turns the tensors into floats (a host sync it
pays, not the step) and writes them out: a line per step to the file, or TensorBoard events and
``log_batch`` calls (whose Python work, SQLAlchemy and protobuf, holds the GIL the step needs), in one
burst per interval rather than a wake-up per window, each of which would take a core from the step's
threads for a moment. ``close`` drains and waits (end of run). A failure in the thread is printed when it
happens and raised again by ``close``, so a run whose metrics were lost does not pass as clean.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from trainyard.training.metrics import log_points, open_for_append
from trainyard.training.run_config import RunConfig

QUEUE_ITEMS = 10_000  # windows of steps; a full queue drops (and counts) rather than block the step
CLOSE_TIMEOUT_S = 300.0  # the longest rank 0 waits at exit for the last metrics to be written
READY_TIMEOUT_S = 120.0  # the longest the loop waits for the MLflow / TensorBoard imports and clients


class TrackingError(RuntimeError):
    """Metrics could not be written to MLflow / TensorBoard."""


def _floats(values: Any, n: int) -> list[float]:
    if hasattr(values, "tolist"):  # a tensor (maybe on a GPU): synced here, in the thread
        values = values.tolist()
    if not isinstance(values, Sequence):
        values = [values] * n
    return [float(v) for v in values]


# Sets of histogram copies waiting for the thread, which bins them in its bursts every ``every_s``: woken
# for each set instead, it binned beside the step and cost one process 42 % of its speed (bench/loop.py)
HISTOGRAMS_IN_FLIGHT = 2
HISTOGRAM_BINS = 64  # TensorBoard shows 30; its own default ("tensorflow", ~1500 edges) binned 6x slower


def _histogram(writer, tag: str, t, step: int) -> None:
    """``t``'s finite values as a TensorBoard histogram of :data:`HISTOGRAM_BINS` equal bins, binned by
    numpy. Not by torch: a torch op in this thread shares the intra-op thread pool with the training's
    own and, on a busy CPU, cost one process 59 % of its speed where numpy costs it a few (bench/loop.py)."""
    import numpy as np

    values = t.detach().cpu().numpy().ravel().astype(np.float64, copy=False)
    values = values[np.isfinite(values)]
    if not values.size:
        return
    lo, hi = float(values.min()), float(values.max())
    hi = hi if hi > lo else lo + max(abs(lo), 1.0) * 1e-6  # a constant tensor: one narrow bin
    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS, range=(lo, hi))
    writer.add_histogram_raw(
        tag, lo, hi, values.size, float(values.sum()), float(values @ values), edges[1:].tolist(), counts.tolist(), step
    )


class Tracker:
    """``log(steps, {name: values})``: one value per step, as a tensor, a list of floats, or one float
    for all of them. Nothing is written unless the run config names a metrics file, an MLflow run or a
    TensorBoard dir; with a metrics file, only that is written."""

    def __init__(self, cfg: RunConfig, every_s: float = 5.0) -> None:
        self.metrics_file = cfg.metrics_file
        self.uri, self.run_id = (None, None) if self.metrics_file else (cfg.tracking_uri, cfg.mlflow_run_id)
        self.tb_dir = None if self.metrics_file else cfg.tensorboard_dir
        # histograms go beside the scalars, or (a metrics file) to an event file of the worker's own
        self.hist_dir = (cfg.histogram_dir if self.metrics_file else cfg.tensorboard_dir) or None
        self.histograms_on = bool(self.hist_dir) and cfg.spec.tracking.histogram_every_steps > 0
        # sets of copies not written yet (they may be on a GPU): HISTOGRAMS_IN_FLIGHT, one more where a set
        # is taken while the thread drains the queue
        self._histograms_waiting = 0
        self.enabled = bool(self.metrics_file) or bool(self.uri and self.run_id) or bool(self.tb_dir)
        self.every_s = every_s
        self.dropped = 0  # metric points the full queue turned away
        self.histograms_skipped = 0  # histogram sets not taken: the thread was still binning earlier ones
        self.error: BaseException | None = None
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_ITEMS)
        self._ready = threading.Event()  # the thread's imports and clients are done (or failed)
        self._wake = threading.Event()  # write now: the queue is half full, or closing
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="trainyard-tracker", daemon=True)
        if self.enabled:
            self._thread.start()
        else:
            self._ready.set()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait until the thread has imported MLflow / TensorBoard and made its clients (or failed to), so
        that the loop does not share the GIL with those imports; False if that took longer than ``timeout``."""
        return self._ready.wait(timeout)

    def check(self) -> None:
        """Raise TrackingError if the thread has failed (metrics were or would be lost)."""
        if self.error is not None:
            raise TrackingError(f"metrics were lost: {type(self.error).__name__}: {self.error}") from self.error

    # -- the training thread -------------------------------------------------------------------------------
    def log(self, steps: Sequence[int], metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            self._q.put_nowait((list(steps), dict(metrics)))
        except queue.Full:
            self.dropped += len(steps)
        if self._q.qsize() >= self._q.maxsize // 2:  # wake the thread before its interval is up
            self._wake.set()

    def histograms(self, step: int, model) -> None:
        """Per-layer weights and gradients of ``model`` at ``step``, as TensorBoard histograms. The step
        pays an fp32 copy of each on its device (the optimizer changes them in place); the thread takes
        them to the host and bins them."""
        if not (self.enabled and self.histograms_on):
            return
        if self._histograms_waiting >= HISTOGRAMS_IN_FLIGHT:  # skip this one (counted) until they are written
            self.histograms_skipped += 1
            return
        import torch

        tensors = {}
        for name, p in model.named_parameters():
            name = name.removeprefix("module.").removeprefix("_orig_mod.")
            tensors[f"weights/{name}"] = p.detach().to(torch.float32, copy=True)
            if p.grad is not None:
                tensors[f"gradients/{name}"] = p.grad.detach().to(torch.float32, copy=True)
        try:
            self._q.put_nowait(("histograms", step, tensors))
            self._histograms_waiting += 1
        except queue.Full:  # the metric points' queue is full: the writer fell behind (counted with them)
            self.dropped += 1

    def close(self, check: bool = True) -> None:
        """Send everything and stop; with ``check``, raise TrackingError if anything could not be written."""
        if self.enabled and self._thread.is_alive():
            # Waiting is fine here (the run is over), but not forever: a hung tracking server must not hang
            # the job, so after CLOSE_TIMEOUT_S the unwritten metrics count as lost.
            self._closing = True
            self._wake.set()
            self._thread.join(CLOSE_TIMEOUT_S)
            if self._thread.is_alive() and self.error is None:
                self.error = TimeoutError(f"the tracking writer did not finish within {CLOSE_TIMEOUT_S:.0f}s")
        if check:
            self.check()
        if self.dropped:
            print(f"[trainer] tracking: {self.dropped} metric points dropped (the writer fell behind)", flush=True)
        if self.histograms_skipped:
            print(
                f"[trainer] tracking: {self.histograms_skipped} of the histogram sets due were skipped (the tracking "
                "thread was still binning earlier ones; a larger tracking.histogram_every_steps keeps them all)",
                flush=True,
            )

    # -- the tracker thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        client = writer = sink = None
        run_id = ""  # the MLflow run's id, set with the client
        try:
            if self.metrics_file:
                sink = open_for_append(self.metrics_file)
            if self.uri and self.run_id:  # imported here, off the step: MLflow takes seconds to import
                from mlflow.tracking import MlflowClient

                client, run_id = MlflowClient(self.uri), self.run_id
            if self.tb_dir or self.histograms_on:
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(self.tb_dir or self.hist_dir)
        except BaseException as err:  # noqa: BLE001 - reported now and raised by close()
            self._fail(err)
        finally:
            self._ready.set()
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            closing = self._closing  # read before taking the queue: what was logged before close() is in it
            windows = []  # (steps, metrics) as the loop sent them, and histograms, written together
            with contextlib.suppress(queue.Empty):
                while True:
                    windows.append(self._q.get_nowait())
            if windows and self.error is None:  # after a failure nothing is written (or kept)
                try:
                    self._write(windows, client, run_id, writer, sink)
                except BaseException as err:  # noqa: BLE001 - reported now and raised by close()
                    self._fail(err)
            del windows  # the histograms' copies go before the next set may be taken
            self._histograms_waiting = 0
            if closing:
                for done in (writer, sink):
                    if done is not None:
                        done.close()
                return

    @staticmethod
    def _write(windows: list, client, run_id: str, writer, sink=None) -> None:
        """The windows' points to the metrics file (a line per step), or to MLflow and TensorBoard; the
        histograms to TensorBoard."""
        for item in windows:
            if item[0] == "histograms":
                _, step, tensors = item
                for tag, t in tensors.items():
                    _histogram(writer, tag, t, step)
                writer.flush()
        windows = [w for w in windows if w[0] != "histograms"]
        points = [
            (step, name, value)
            for steps, metrics in windows
            for name, values in metrics.items()
            for step, value in zip(steps, _floats(values, len(steps)), strict=True)
        ]
        if sink is not None:
            by_step: dict[int, dict[str, float]] = {}
            for step, name, value in points:
                by_step.setdefault(step, {})[name] = value
            sink.write("".join(json.dumps({"step": step, **values}) + "\n" for step, values in by_step.items()))
            sink.flush()  # whole lines only: the relay reads up to the last newline
            writer = None  # the scalars go through the file; this process's writer holds histograms only
        log_points(points, client, run_id, writer=writer)

    def _fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
            print(f"[trainer] tracking failed, metrics from here on are lost: {type(err).__name__}: {err}", flush=True)
