"""RunConfig: what the train task hands to every worker process, as the one JSON file on disk; and the
``work`` directory, where the workers hand back what they made.

The JobSpec inside is the validated model; JSON exists only in the file (the process boundary), and
``load`` validates it again, so a worker never reads a spec field with its own default.

What the workers write (a custom program's files; a built-in trainer's model, result and metrics) is read
by the platform with its own rights, so it is read as untrusted: :func:`open_untrusted` and
:func:`output_file` follow no link and accept only a regular file with one name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.errors import PermanentError
from trainyard.spec import JobSpec

if TYPE_CHECKING:
    from trainyard.data.prepare import PreparedData

RUN_CONFIG_FILE = "run_config.json"  # in the run's directory: what its workers start from
WORK_DIR = "work"  # in the run's directory: all its workers may write (the platform's files are beside it)


def work_dir(run_dir: str) -> str:
    """Where the workers of the run in ``run_dir`` write (a POSIX path: the pods' as well as this host's)."""
    return posixpath.join(run_dir, WORK_DIR)


class WorkerOutputError(PermanentError, ValueError):
    """A file the workers left is not one the platform reads: a link, a pipe, a malformed record."""


@contextlib.contextmanager
def open_untrusted(path: Path) -> Iterator[int | None]:
    """A file the workers wrote, as a descriptor opened without following a link (None if there is none);
    anything but a regular file with one name is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    except OSError as err:  # ELOOP: the last component is a symbolic link
        raise WorkerOutputError(f"{path} is not a regular file of its own ({err.strerror}): {_WRITE_IT}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise WorkerOutputError(f"{path} is not a regular file of its own (a hard link, a pipe?): {_WRITE_IT}")
        yield fd
    finally:
        os.close(fd)


_WRITE_IT = "the training must write the file itself, not link to one"


def output_file(run_dir: str | Path, name: str) -> Path | None:
    """The workers' output ``name`` in ``work/`` as a regular file of its own, None if they wrote none.
    Called once the workers have ended (the sandbox user has nothing left running and the tree is the
    platform's again), so the file checked is the file a library then reads by its path."""
    path = Path(work_dir(str(run_dir))) / name
    with open_untrusted(path) as fd:
        return None if fd is None else path


@dataclass(frozen=True)
class RunConfig:
    spec: JobSpec
    out_dir: str
    # the prepared data's record (prepare_data's); None: a recipe that makes its own (bench/gpu.py's)
    data: PreparedData | None = None
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    tensorboard_dir: str | None = None
    # Rank 0 appends its metrics here instead of writing MLflow and TensorBoard itself: the local launcher
    # relays them (trainyard.training.metrics), so a sandboxed worker needs neither store
    metrics_file: str | None = None
    # A sweep trial: the val metric rank 0 reports at each epoch's end, then waits to hear whether the
    # trial goes on (trainyard.training.handshake); None for a job that is not a trial
    trial_objective: str | None = None
    # Where rank 0 writes its TensorBoard histograms when it writes a metrics file (a local worker): the
    # launching task copies them beside the run's scalars (trainyard.training.metrics.copy_histograms)
    histogram_dir: str | None = None
    # A replay (spec.replay_of) trained in a pod: the dependency set the version's trainer had, which the
    # workers compare with their own before they train (trainyard.training.entry); None otherwise
    replay_dependencies: list[str] | None = None

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"

    def to_json(self) -> dict:
        return {
            "spec": self.spec.model_dump(mode="json"),
            "data": None if self.data is None else self.data.model_dump(mode="json"),
            "out_dir": self.out_dir,
            "tracking_uri": self.tracking_uri,
            "mlflow_run_id": self.mlflow_run_id,
            "tensorboard_dir": self.tensorboard_dir,
            "metrics_file": self.metrics_file,
            "trial_objective": self.trial_objective,
            "histogram_dir": self.histogram_dir,
            "replay_dependencies": self.replay_dependencies,
        }

    def dump(self, path: str | Path) -> Path:
        """Write atomically (a worker that starts while a retry re-plans reads the old file or the new)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """The config in ``path`` (:meth:`from_json`)."""
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def from_json(cls, raw: dict) -> RunConfig:
        """The config :meth:`to_json` gave, its spec and data validated; a field this version does not know
        (a newer platform's) is ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in raw.items() if k in known and k not in ("spec", "data")}
        from trainyard.data.prepare import PreparedData

        data = None if raw.get("data") is None else PreparedData.model_validate(raw["data"])
        return cls(**fields, spec=JobSpec.model_validate(raw["spec"]), data=data)
