"""A training's hold on its admission (:func:`hold`): its devices, a heartbeat that renews its lease in the
ledger (:mod:`.ledger`) and takes it back if it ran out, and listens for the word that the job is
preempted; its release once the training can no longer run, or, preempted, its return to the queue in its
old place. Nothing leaks when a process dies: a lease that is not renewed runs out, and the next decision
drops it.

A multi-node job is admitted once, for all its nodes: node 0's training holds the admission, and each other
node's follows it (:func:`follow`): it claims its devices on its own host, hears the word as node 0 does,
and neither renews nor releases anything; its devices go with the job's admission.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError, Preempted, RetryableError, is_permanent
from trainyard.scheduling.admission.ledger import ADMITTED_LEASE_S, Ledger, NotAdmitted
from trainyard.scheduling.admission.policy import Job
from trainyard.scheduling.ledger_db import DatabaseUnavailable

if TYPE_CHECKING:
    from trainyard.scheduling.budgets import Spend

HEARTBEAT_S = 30.0  # a running training renews its lease this often (for ledger.RUNNING_LEASE_S)
WORD_POLL_S = 2.0  # and looks this often for the word that it is preempted (one read of its row)
log = logging.getLogger(__name__)


class AdmissionLost(RetryableError):
    """The job's lease ran out while it trained and its slots went to another job: its training was
    stopped (never two jobs on one GPU). A retry resumes from its newest checkpoint once admitted again."""


@dataclass
class Lease:
    """What :func:`hold` gives the training: the devices it may use and the signal to stop."""

    devices: list[str] | None  # this host's GPUs the job was given (CUDA_VISIBLE_DEVICES); None: a CPU job
    lost: threading.Event  # set when the lease ran out and its slots could not be taken back: stop training
    waited_s: float | None = None  # from the job's arrival in the queue to its admission
    # set when the ledger preempts the job: checkpoint, stop, and raise Preempted (the job waits again)
    preempted: threading.Event = field(default_factory=threading.Event)
    grace_s: float = 30.0  # from the word to the kill (scheduling.preemption.grace_seconds)


def admitted(ledger: Ledger, job: Job, spend: Spend | None = None) -> None:
    """The job's admission, renewed; asked for again where it ran out (a retry long after its try, a preempted
    job back in its place). NotAdmitted if it cannot be had now; PermanentError if it never can."""
    if ledger.renew(job.id):
        return
    verdict = ledger.request(job, spend)
    if verdict.final:  # taken out of the queue, or its team or type gone: no retry brings it back
        raise PermanentError(f"job {job.id}: {verdict.message}")
    if not verdict.admitted:
        raise NotAdmitted(f"job {job.id} is not admitted any more: {verdict.message}")
    ledger.renew(job.id)


class _Heartbeat:
    """A thread that renews the job's lease every ``every`` seconds; one that ran out is taken back
    (:meth:`Ledger.reclaim`), and where its slots went to another job meanwhile, or it was cancelled,
    ``lease.lost`` is set and the beats end. Every :data:`WORD_POLL_S` it looks for the word that the job
    is preempted, and sets ``lease.preempted``."""

    def __init__(self, ledger: Ledger, job: Job, lease: Lease, every: float) -> None:
        self.ledger, self.job, self.lease, self.every = ledger, job, lease, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="trainyard-admission-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        ledger, job = self.ledger, self.job
        renewed = time.monotonic()
        while not self.stop.wait(min(self.every, WORD_POLL_S)):
            try:
                if not self.lease.preempted.is_set() and ledger.preempted_for(job.id):
                    # (the job it gives its slots to may be another team's: not named in this team's log)
                    log.warning(
                        "%s is preempted for a job within its team's quota: its workers checkpoint and stop", job.id
                    )
                    self.lease.preempted.set()
                if time.monotonic() - renewed < self.every:
                    continue
                renewed = time.monotonic()
                if ledger.renew(job.id):
                    continue
                if ledger.reclaim(job, tuple(self.lease.devices or ())):
                    log.warning("admission of %s ran out while it trained; it took its slots back", job.id)
                    continue
                why = ledger.cancelled(job.id) or "its lease ran out while it trained and its slots went to another job"
                log.error("admission of %s: %s; stopping its workers", job.id, why)
                self.lease.lost.set()
                return
            except Exception as err:  # noqa: BLE001 - retried at the next beat; the thread must not die
                log.warning("admission heartbeat of %s failed: %s: %s", job.id, type(err).__name__, err)

    def end(self) -> None:
        self.stop.set()
        self.thread.join()


def _lost(ledger: Ledger, job: Job) -> Exception:
    """What a training whose lease was lost ends in: cancelled (no retry), or AdmissionLost."""
    cancelled = ledger.cancelled(job.id)
    if cancelled:
        return PermanentError(f"job {job.id}: {cancelled}; its workers were stopped")
    return AdmissionLost(
        f"job {job.id}: its admission ran out while it trained and its slots went to another job, so its "
        "workers were stopped; a retry waits for admission and resumes from the newest checkpoint"
    )


def _hand_back(ledger: Ledger, job: Job, for_good: bool, preempted: bool = False) -> None:
    """Release the admission (slots, devices, place), or keep it ``ADMITTED_LEASE_S`` for a retry; a
    preempted job's slots go and it waits again in its place."""
    try:
        if preempted:
            ledger.requeue(job.id)
        elif for_good:
            ledger.release(job.id)
        else:
            ledger.renew(job.id, ADMITTED_LEASE_S)
    except DatabaseUnavailable as err:  # the lease runs out by itself; the training's own outcome stands
        log.warning("could not hand back the admission of %s: %s", job.id, err)


def _claimed(ledger: Ledger, job: Job, node: int, available: list[str] | None) -> list[str] | None:
    """Node ``node``'s devices of this host (None for a type whose slots are no devices): a job of one node
    has all its slots here, a node of several its share (its host recorded, its endpoint not yet said)."""
    if job.nodes == 1:
        return None if available is None else ledger.claim_devices(job.id, job.slots, available)
    if available is None:
        ledger.join_node(job.id, node)
        return None
    return ledger.claim_devices(job.id, job.per_node, available, node=node)


class JobGone(NotAdmitted):
    """A node of a multi-node job found the job neither admitted nor waiting (node 0's try ended without
    giving it back, its lease ran out): its task looks again later (rescheduled, no retry used), once node
    0's retry has queued the job again, and stops once node 0's task has failed for good."""


def _leave(ledger: Ledger, job: Job, node: int) -> None:
    """A multi-node job's node ``node`` ends its try here: its devices and (node 0's) endpoint go at once."""
    if job.nodes > 1:
        try:
            ledger.leave_node(job.id, node)
        except DatabaseUnavailable as err:  # they go with the job's admission all the same
            log.warning("could not record that node %d of %s left: %s", node, job.id, err)


class _Follower:
    """A thread that looks every :data:`WORD_POLL_S` at the admission a multi-node job's node 0 holds: the
    word that the job is preempted sets ``lease.preempted``; its cancel, or its admission gone while the job
    has not finished (its lease ran out, or it waits again), sets ``lease.lost``: this node's devices are
    free then, and its workers must stop."""

    def __init__(self, ledger: Ledger, job: Job, lease: Lease) -> None:
        self.ledger, self.job, self.lease = ledger, job, lease
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._look, name="trainyard-admission-follower", daemon=True)
        self.thread.start()

    def _look(self) -> None:
        ledger, job = self.ledger, self.job
        while not self.stop.wait(WORD_POLL_S):
            try:
                if not self.lease.preempted.is_set() and ledger.preempted_for(job.id):
                    log.warning("%s is preempted: this node's workers checkpoint and stop with node 0's", job.id)
                    self.lease.preempted.set()
                why = ledger.cancelled(job.id)
                if why is None and not self.lease.preempted.is_set():
                    if ledger.queued(job.id) and not ledger.admitted(job.id, live=False):
                        # waiting again (preempted, node 0 gave the slots back before this look heard the word)
                        log.warning("%s waits again: this node's workers checkpoint and stop", job.id)
                        self.lease.preempted.set()
                    elif not ledger.queued(job.id) and not ledger.finished(job.id):
                        why = "its admission is gone (node 0's try ended without it)"
                if why is not None:
                    log.error("%s: %s; stopping this node's workers", job.id, why)
                    self.lease.lost.set()
                    return
            except Exception as err:  # noqa: BLE001 - looked at again; the thread must not die
                log.warning("admission look of %s failed: %s: %s", job.id, type(err).__name__, err)

    def end(self) -> None:
        self.stop.set()
        self.thread.join()


@contextlib.contextmanager
def follow(ledger: Ledger, job: Job, node: int, *, available: list[str] | None = None) -> Iterator[Lease]:
    """Around the training of node ``node`` (not 0) of the multi-node ``job``, whose node 0 holds its
    admission (:func:`hold`): its share of ``available`` (this host's GPUs), the word that the job is
    preempted (node 0 gives the slots back), its cancel (PermanentError), and its admission gone. NotAdmitted
    where the job waits (the task waits and looks again); JobGone where it is not queued at all."""
    cancelled = ledger.cancelled(job.id)
    if cancelled:
        raise PermanentError(f"job {job.id}: {cancelled}")
    if not ledger.admitted(job.id):
        if ledger.queued(job.id):
            raise NotAdmitted(f"job {job.id} is not admitted now: its node {node} waits for node 0's admission")
        raise JobGone(f"job {job.id} is neither admitted nor waiting: node 0's try ended without it")
    devices = _claimed(ledger, job, node, available)
    if devices is not None:
        log.info("job %s node %d holds %s device(s) %s of host %s", job.id, node, job.gpu_type, devices, ledger.host)
    lease = Lease(devices, threading.Event(), grace_s=ledger.config.scheduling.preemption.grace_seconds)
    follower = _Follower(ledger, job, lease)
    try:
        yield lease
        if lease.lost.is_set():
            raise _lost(ledger, job)
    finally:
        follower.end()
        _leave(ledger, job, node)


@contextlib.contextmanager
def hold(
    ledger: Ledger,
    job: Job,
    *,
    final_try: bool = False,
    available: list[str] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    spend: Spend | None = None,
) -> Iterator[Lease]:
    """Around a job's training: its admission, renewed every ``heartbeat_s`` by a thread, and with
    ``available`` (this host's GPUs) ``slots`` of them for the job (:meth:`Ledger.claim_devices`).

    Released (slots, devices and place in the queue) once the training can no longer run: it succeeded,
    failed for good (a permanent error, :func:`trainyard.errors.is_permanent`) or failed on its
    ``final_try``. After another failure it is kept for ``ADMITTED_LEASE_S``, for the retry to find. An
    admission that ran out before the training (a retry long after its try) is asked for again;
    NotAdmitted if it cannot be had now (the task waits and tries again). A lease that runs out while the
    job trains is taken back (:meth:`Ledger.reclaim`); where another job has its slots by then,
    ``Lease.lost`` is set for the launcher to stop the workers, and the training ends in AdmissionLost.
    Where the ledger preempts the job, ``Lease.preempted`` is set for the launcher to tell the workers; a
    training that ends in Preempted gives its slots back and waits again in its old place
    (:meth:`Ledger.requeue`)."""
    admitted(ledger, job, spend)
    try:
        devices = _claimed(ledger, job, 0, available)
    except PermanentError:  # more devices than the host has: this job can never run here
        ledger.release(job.id)
        raise
    if devices is not None:
        log.info("job %s holds %s device(s) %s of host %s", job.id, job.gpu_type, devices, ledger.host)
    entry = next((e for e in ledger.entries() if e.job.id == job.id), None)
    waited = None if entry is None or entry.admitted is None else max(entry.admitted - entry.waiting_from, 0.0)
    lease = Lease(devices, threading.Event(), waited, grace_s=ledger.config.scheduling.preemption.grace_seconds)
    heartbeat = _Heartbeat(ledger, job, lease, heartbeat_s)
    for_good, preempted = True, False
    try:
        yield lease
        if lease.lost.is_set():  # workers that exit 0 when stopped leave a partial result: not a success
            raise _lost(ledger, job)
    except Preempted as err:
        if lease.lost.is_set():  # cancelled, or its lease lost, meanwhile: that is how it ends
            ending = _lost(ledger, job)
            for_good = final_try or is_permanent(ending)
            raise ending from err
        preempted = True
        raise
    except (AdmissionLost, PermanentError) as err:  # the lease lost after a clean body, or a cancel
        for_good = final_try or is_permanent(err)
        raise
    except Exception as err:
        for_good = final_try or is_permanent(err)
        if lease.lost.is_set() and not is_permanent(err):
            ending = _lost(ledger, job)
            for_good = final_try or is_permanent(ending)
            raise ending from err
        raise
    except BaseException:  # the task was terminated (marked failed, timed out): Airflow decides what comes next
        for_good = final_try
        raise
    finally:
        heartbeat.end()
        _leave(ledger, job, 0)
        _hand_back(ledger, job, for_good, preempted)
