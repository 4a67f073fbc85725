"""Waiting for admission in the triggerer: a job that waits for its GPUs holds no worker and starts none.

The trigger asks the admission ledger (``trainyard.scheduling.admission.ledger``) every
``scheduling.admission_poll_seconds``; each look renews the job's place in the queue, as a look of the
reschedule-mode sensor did, but it costs a ledger transaction in the triggerer instead of a task process
on a worker. When the ledger admits the job, the trigger ends the task itself (``end_from_trigger``), so
the admission is not followed by a worker start either; the reason it got ("admitted: 2 a100-80gb slot(s)
...") is the task's XCom. The task log says why the job waits and its place in the queue ("waiting, 2 of 3
for a100: ..."), at every change of the reason and every ``STILL_WAITING_LOG_S`` while it stays the same.

Between looks a trigger does not sleep blind: one watch per triggerer process (:class:`AdmissionWatch`)
reads the ledger's admitted jobs every ``WATCH_S`` (one read for all its triggers, on one connection) and
wakes a trigger as soon as its job is admitted by another's look, and one waiting trigger to look when an
admitted job has handed its slots back. So GPUs freed by a training go to the next job within about
``2 x WATCH_S``, whatever the poll interval. Other changes (a waiting job cancelled, a quota raised in
resources.yaml, budget freed) are seen at the next poll.

A triggerer that dies takes no reservation with it: the job's waiting row runs out (its lease) and its
arrival is kept, so the restarted trigger finds its place again. A task marked failed or cleared while it
waits withdraws its row (``on_kill``). A ledger that cannot be read for a moment (SQLite locked past its
timeout, a PostgreSQL server restarting) is logged and looked at again at the next tick; resources.yaml is
read again at every look, and an edit that broke it leaves the last good version in force (the log says
what is wrong, at every look).
A job still waiting after ``scheduling.queue_wait_notice_minutes`` hands back to its task once, which tells
its team (notice ``queue_wait``) and defers again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSuccessEvent, TriggerEvent

if TYPE_CHECKING:
    from trainyard.scheduling.admission.ledger import Ledger
    from trainyard.scheduling.admission.policy import Job, Verdict

POLL_BEFORE_LEDGER_S = 10.0  # how soon a trigger that could not open the ledger yet tries again
WATCH_S = 0.2  # how often a triggerer's watch reads which jobs the ledger admitted
STILL_WAITING_LOG_S = 300.0  # a waiting job's unchanged reason, said again this often (with its place)

log = logging.getLogger(__name__)


class _LedgerReader:
    """The watch's one connection to the ledger, kept open and used on one thread of its own (a SQLite
    connection must stay on the thread that opened it); opened again after an error."""

    def __init__(self) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="admission-watch")
        self.ledger: Ledger | None = None
        self.open = contextlib.ExitStack()
        self.conn: Any = None

    def admitted(self) -> set[str]:
        from trainyard.scheduling.admission.ledger import default_ledger

        if self.ledger is None:
            self.ledger = default_ledger()
        if self.conn is None:
            self.conn = self.open.enter_context(self.ledger.db.connection())
        try:
            return self.ledger.admitted_ids(self.conn)
        except Exception:
            self.drop()
            raise

    def drop(self) -> None:
        self.conn = None
        with contextlib.suppress(Exception):
            self.open.close()
        self.open = contextlib.ExitStack()

    def close(self) -> None:
        self.thread.submit(self.drop)
        self.thread.shutdown(wait=False)


class AdmissionWatch:
    """What a triggerer process's waiting admission triggers share: every ``WATCH_S``, one read of the
    ledger's admitted jobs. A trigger whose job is among them is woken at once (another trigger's look
    admitted it: a look decides for every waiting job). When an admitted job is gone since the last read
    (its training ended and handed its slots back), the trigger that registered first is woken to look, so
    the freed slots are given out now rather than at the next poll; the first read counts as such a change.
    It runs while any trigger waits. One per event loop: :meth:`of`."""

    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AdmissionWatch] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Event] = {}  # job id -> its trigger's wake-up, in the order they came
        self.admitted: set[str] | None = None  # at the last read (None: none yet)
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> AdmissionWatch:
        if loop not in cls._of_loop:
            cls._of_loop[loop] = cls()
        return cls._of_loop[loop]

    def register(self, job_id: str) -> asyncio.Event:
        """The event set when ``job_id``'s trigger should look now (it clears it before each look)."""
        wake = self.waiting.setdefault(job_id, asyncio.Event())
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())
        return wake

    def unregister(self, job_id: str) -> None:
        self.waiting.pop(job_id, None)

    def _wake(self, admitted: set[str]) -> None:
        freed = self.admitted is None or bool(self.admitted - admitted)
        self.admitted = admitted
        for job_id in admitted & self.waiting.keys():
            self.waiting[job_id].set()
        if freed:
            first = next((j for j in self.waiting if j not in admitted), None)
            if first is not None:
                self.waiting[first].set()

    async def _run(self) -> None:
        reader = _LedgerReader()
        said = ""
        try:
            while self.waiting:
                await asyncio.sleep(WATCH_S)
                try:
                    admitted = await asyncio.get_running_loop().run_in_executor(reader.thread, reader.admitted)
                except Exception as err:  # the triggers' own looks go on at their poll, and say what is wrong
                    if str(err) != said:
                        log.warning("admission watch: cannot read the ledger (%s); the poll goes on", err)
                        said = str(err)
                    continue
                said = ""
                self._wake(admitted)
        finally:  # nothing awaited from the loop's check to here: a trigger that registers next starts anew
            self.task, self.admitted = None, None
            reader.close()


class AdmissionTrigger(BaseTrigger):
    """Ask the ledger for ``job`` (the fields of ``trainyard.scheduling.admission.policy.Job``) until it is admitted."""

    def __init__(
        self, job: dict[str, Any], end_from_trigger: bool = True, since: float = 0.0, notice_at: float | None = None
    ) -> None:
        """``since``: when the job began to wait (epoch seconds); ``notice_at``: when, still waiting, it hands
        back to the task (event ``{"waiting": True, ...}``) so that its team is told (None: never)."""
        super().__init__()
        self.job = job
        self.end_from_trigger = end_from_trigger
        self.since, self.notice_at = since, notice_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"job": self.job, "end_from_trigger": self.end_from_trigger}
        return f"{__name__}.{type(self).__name__}", {**kwargs, "since": self.since, "notice_at": self.notice_at}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainyard.scheduling.admission.policy import Job

        job = Job(**self.job)
        watch = AdmissionWatch.of(asyncio.get_running_loop())
        try:
            async for event in self._looks(job, watch):
                yield event
                return
        finally:
            watch.unregister(job.id)

    async def _looks(self, job: Job, watch: AdmissionWatch) -> AsyncIterator[TriggerEvent]:
        """Look until there is something to tell the task: admitted, cancelled, or still waiting at
        ``notice_at``; between looks, wait for the poll interval or the watch, whichever comes first."""
        from trainyard.errors import RetryableError
        from trainyard.scheduling.admission.ledger import default_ledger, look, verdict_in_words
        from trainyard.scheduling.resources import ResourcesError, resources_in_force

        ledger = None
        said: Verdict | None = None
        said_at = 0.0
        while True:
            wake = watch.register(job.id)
            wake.clear()  # what the watch sees from here on wakes the wait after this look
            try:
                if ledger is None:  # inside the try: a database restarting as the trigger starts is waited out
                    ledger = await asyncio.to_thread(default_ledger)
                # resources.yaml as it is now (a quota changed while the job waits applies to its next look);
                # an edit that broke it is logged at every look, and the last good version stays in force
                ledger.config = await asyncio.to_thread(resources_in_force, None, self.log.warning)
                verdict = await asyncio.to_thread(look, ledger, job)
                # a new verdict (another reason, or new figures), or the same one for a while: said with the
                # job's place in the queue
                if verdict != said or time.monotonic() - said_at >= STILL_WAITING_LOG_S:
                    words = await asyncio.to_thread(verdict_in_words, ledger, job.id, verdict, self.since)
                    self.log.info("admission of %s: %s", job.id, words)
                    said, said_at = verdict, time.monotonic()
            except (sqlite3.Error, OSError, ResourcesError, RetryableError) as err:
                # the ledger locked or unreadable, no good resources.yaml to fall back on: look again later
                self.log.warning("admission of %s: could not look (%s); looking again", job.id, err)
            else:
                if verdict.final:  # cancelled or inadmissible: the task ends failed (the reason is logged above)
                    if self.end_from_trigger:
                        yield TaskFailedEvent()
                    else:
                        yield TriggerEvent({"admitted": False, "reason": verdict.message})
                    return
                if verdict.admitted:
                    if self.end_from_trigger:
                        yield TaskSuccessEvent(xcoms={"return_value": verdict.message})
                    else:
                        yield TriggerEvent({"admitted": True, "reason": verdict.message})
                    return
                if self.notice_at is not None and time.time() >= self.notice_at:
                    # the task tells the team and waits on (its worker's notifiers, connections and log)
                    yield TriggerEvent(
                        {"admitted": False, "waiting": True, "reason": verdict.message, "since": self.since}
                    )
                    return
            poll = ledger.config.scheduling.admission_poll_seconds if ledger else POLL_BEFORE_LEDGER_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll):  # (3.11's wait_for can swallow the trigger's cancellation)
                    await wake.wait()

    async def on_kill(self) -> None:
        """The task was marked failed or cleared while it waited: its place (and any slots it was just
        given) go back now rather than when its lease runs out."""
        from trainyard.scheduling.admission.ledger import default_ledger

        ledger = await asyncio.to_thread(default_ledger)
        await asyncio.to_thread(ledger.withdraw, self.job["id"])
