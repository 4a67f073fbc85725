"""The embedded MLflow store under concurrent first use: the processes that create it at once (a sweep's
first trials) all get a working store."""

import multiprocessing
import os


def _first_use(home: str, out) -> None:
    os.environ["TRAINYARD_HOME"] = home
    from trainyard.tracking import mlflow_tracking as mt

    try:
        c = mt.client()
        mt.experiment_id(c, "digits", "default")
        out.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        out.put(repr(err))


def test_processes_creating_the_store_at_once_all_get_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_first_use, args=(str(tmp_path / "home"), out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
    assert results == ["ok"] * 4
