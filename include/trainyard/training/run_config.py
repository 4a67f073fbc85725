"""RunConfig: what the train task hands to every worker process, as the one JSON file on disk.

The JobSpec inside is the validated model; JSON exists only in the file (the process boundary), and
``load`` validates it again, so a worker never reads a spec field with its own default.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from trainyard.spec import JobSpec

RUN_CONFIG_FILE = "run_config.json"  # in the run's directory: what its workers start from


@dataclass(frozen=True)
class RunConfig:
    spec: JobSpec
    data: dict  # the prepared-data manifest written by prepare_data
    out_dir: str
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    tensorboard_dir: str | None = None

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"

    def to_json(self) -> dict:
        return {
            "spec": self.spec.model_dump(mode="json"),
            "data": self.data,
            "out_dir": self.out_dir,
            "tracking_uri": self.tracking_uri,
            "mlflow_run_id": self.mlflow_run_id,
            "tensorboard_dir": self.tensorboard_dir,
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
        raw = json.loads(Path(path).read_text())
        return cls(**{**raw, "spec": JobSpec.model_validate(raw["spec"])})
