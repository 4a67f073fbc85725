"""The embedded MLflow store under concurrent first use: the processes that create it at once (a sweep's
first trials) all get a working store."""

import os

from processes import in_processes


def _first_use(home: str) -> str:
    os.environ["TRAINYARD_HOME"] = home
    from trainyard.tracking import mlflow_tracking as mt

    c = mt.client()
    return mt.experiment_id(c, "digits", "default")


def test_processes_creating_the_store_at_once_all_get_it(tmp_path):
    experiments = in_processes(_first_use, [(str(tmp_path / "home"),)] * 4, timeout=180)
    assert len(set(experiments)) == 1 and experiments[0], experiments  # one experiment, found by every process
