import os
import shutil
import sys
from pathlib import Path

import pytest

from datafiles import write_files

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))

# `make test` runs TEST_WORKERS (3) pytest processes side by side on a 2-core machine. Each of them, and
# every training worker it starts (the launchers keep a set OMP_NUM_THREADS), computes on one thread:
# with torch's default of a thread per core the processes' threads spin-wait for cores the others hold
# (what that costs: trainyard.training.launchers.base.worker_env).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A shell that `eval "$(make -s cluster-env)"`-ed must not put the suite's fake jobs into the cluster's ledger,
# studies or tracking server, nor hand the Airflows the tests start to its Celery workers: the tests that
# want the cluster profile start one of their own.
for _name in [n for n in os.environ if n.startswith(("AIRFLOW__CELERY", "AIRFLOW__TRAINYARD__"))] + [
    "TRAINYARD_DATABASE_URL",
    "TRAINYARD_CLUSTER_DIR",
    "MLFLOW_TRACKING_URI",
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__OPERATORS__DEFAULT_QUEUE",
    "AIRFLOW_API_URL",
]:
    os.environ.pop(_name, None)

# The rendered config runs Airflow in multi-team mode, a team's own train_pipeline.<team> in its bundle. The
# tests that run DAGs in-process (dag.test(), DagBag) read the one shared train_pipeline of dags/: the mode
# without teams of their own. The Airflows the tests start render theirs (bench/airflow_services.py).
from trainyard_airflow.team_dags import IN_PROCESS_ENV  # noqa: E402 - plugins is on the path from here

os.environ.update(IN_PROCESS_ENV)


def _airflow_db_per_xdist_worker() -> None:
    """`make test` runs the suite in pytest-xdist workers (three); SQLite takes one writer at a time, so each
    worker gets its own copy of the migrated Airflow database (pools included). This runs when pytest
    loads this file, before any test imports Airflow, which reads the setting once."""
    worker, home = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("AIRFLOW_HOME")
    if not worker or not home or not (Path(home) / "airflow.db").is_file():
        return
    original = (Path(home) / "airflow.db").resolve()
    copy = original.with_name(f"airflow-{worker}.db")
    shutil.copyfile(original, copy)
    # the rendered config's URL (with its options) with the copy's path
    rendered = next(
        line.split("=", 1)[1].strip()
        for line in (Path(home) / "airflow.cfg").read_text().splitlines()
        if line.startswith("sql_alchemy_conn")
    )
    if str(original) not in rendered:
        raise RuntimeError(f"{home}/airflow.cfg's database is not {original}: run `make setup` again")
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = rendered.replace(str(original), str(copy))


_airflow_db_per_xdist_worker()

# The sandbox users tests marked `sandbox` take; every other process of the suite (the Airflow servers it
# starts included) trains under the others. Set at import, before any fixture starts a server.
SANDBOX_TEST_USERS = "0-7"
os.environ["TRAINYARD_SANDBOX_USERS"] = "8-63"


@pytest.fixture(autouse=True)
def _sandbox_or_skip(request, monkeypatch):
    """Tests marked ``sandbox`` need the sandbox. Without root it cannot exist: skipped. As root (CI) it
    must: a missing one fails the test, naming what `trainyard sandbox setup` would fix.

    They take sandbox users 0-7, every other test's trainings (sandboxed too, where it can be had) 8-63
    (see above): a training beside a sandbox test must not take or clean up the users that test looks at."""
    if request.node.get_closest_marker("sandbox") is None:
        yield
        return
    monkeypatch.setenv("TRAINYARD_SANDBOX_USERS", SANDBOX_TEST_USERS)
    from trainyard.training.launchers.sandbox import unavailable_reason

    reason = unavailable_reason()
    if reason and os.geteuid() == 0:
        pytest.fail(f"the sandbox is missing on a root machine: {reason}")
    if reason:
        pytest.skip(f"no custom-command sandbox here: {reason}")
    # One sandbox test at a time on the host: they assert which sandbox users are taken and what is left
    # under them, which another xdist worker's launch would change under their feet.
    import fcntl

    from trainyard.training.launchers.sandbox import STATE_DIR

    with open(STATE_DIR / "tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory):
    """An MLflow tracking store with its tables made and nothing in them, made once per test process:
    MLflow's migrations take 2.3 CPU-seconds to make a new store, and a copy of this one is the same store.
    (tests/unit/tracking/test_mlflow_store.py makes new ones, several processes at once.)"""
    from trainyard.tracking import mlflow_tracking

    db = tmp_path_factory.mktemp("empty_mlflow") / "mlflow.db"
    mlflow_tracking.client(f"sqlite:///{db}")
    return db


@pytest.fixture
def trainyard_home(tmp_path, monkeypatch, empty_mlflow_store):
    """A fresh TRAINYARD_HOME (store, cache, runs, MLflow) per test."""
    import shutil

    from trainyard.registry.signing import ensure_keypair

    home = tmp_path / "trainyard"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (home / "mlflow").mkdir(parents=True)
    shutil.copyfile(empty_mlflow_store, home / "mlflow" / "mlflow.db")
    ensure_keypair(home / "keys")  # registered versions are signed
    yield home
    import mlflow

    mlflow.set_tracking_uri(None)  # a test's store must not leak into the next test through MLflow's global


@pytest.fixture
def no_login(tmp_path, monkeypatch):
    for field in ("URL", "TOKEN", "USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"AIRFLOW_API_{field}", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no Airflow login here


@pytest.fixture
def login_as(no_login, monkeypatch):
    """Log the command line in as a user: the API server's answer to who the token is stands in for one
    (the real server answers it in tests/integration/test_under_the_executor.py); announcing fails, as
    without Airflow."""
    from trainyard import airflow_api

    def log_in(user: str, role: str = "user"):
        monkeypatch.setenv("AIRFLOW_API_URL", "http://127.0.0.1:9")  # nothing listens: no announcement
        monkeypatch.setenv("AIRFLOW_API_TOKEN", f"token-of-{user}")
        monkeypatch.setattr(airflow_api, "whoami", lambda login: airflow_api.Caller(user, role))

    return log_in


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """scikit-learn's digits in the image-classification dataset layout, once per session."""
    from trainyard.data.classification import digits_files

    return write_files(tmp_path_factory.mktemp("digits"), digits_files())


@pytest.fixture(scope="session")
def prepared(digits_dir, tmp_path_factory):
    """The digits split 80/20 into LMDB: a prepared-data manifest the trainers read."""
    from trainyard.recipes.digits import prepare_classification

    return prepare_classification(digits_dir, "d" * 64, tmp_path_factory.mktemp("prepared"), 0.2, 0)


# The longest files first. `make test` hands whole files to its xdist workers (--dist loadfile) in collection
# order (--no-loadscope-reorder: xdist would otherwise order files by their number of tests, which puts the
# few-test integration files last), as each worker becomes free: with a long file last, one worker runs it
# alone while the others idle (seen: the scheduler replay's file alone for its last 4 minutes). Order by the
# figures `make test`'s --durations prints; a file not listed keeps its place after these.
LONGEST_FIRST = (  # seconds of each in a `make test` with 3 workers on 2 cores (2026-12-06), setup included
    "tests/integration/test_under_the_executor.py",  # ~800: one Airflow, two teams, the sandbox, a sweep, retraining
    "tests/integration/test_cluster_profile.py",  # ~580: the profile up, a sweep, a worker killed, a replay, a restart
    "tests/integration/test_rest_api.py",  # ~380: the orchestration benchmark's smoke and the queue included
    "tests/integration/test_preemption_under_the_executor.py",  # ~150 alone: two teams' runs, one preempted
    "tests/integration/test_recipe_pipelines.py",  # ~360
    "tests/integration/test_benchmarks.py",  # ~280, the export-parity smoke included
    "tests/integration/test_train_pipeline_dag.py",  # ~130
    "tests/integration/test_resume.py",  # ~75
    "tests/unit/sweeps/test_trials.py",  # ~85
    "tests/integration/test_promote_model_dag.py",  # ~70
    "tests/integration/test_custom_sweep.py",  # ~60
    "tests/integration/test_strategy_golden.py",  # ~55
    "tests/integration/test_deepspeed_training.py",  # ~45
    "tests/integration/test_streaming_memory.py",
)


def pytest_configure(config):
    if os.environ.get("TEST_CPU_DIR"):  # each test's CPU, its processes' included: tests/cpu_per_test.py
        import cpu_per_test

        config.pluginmanager.register(cpu_per_test, "cpu_per_test")


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable for the rest


class PostgresForTests:
    """A throwaway PostgreSQL server (the Debian package's binaries, as in the cluster profile) started by
    the test session; each test makes the databases it needs, fresh."""

    def __init__(self) -> None:
        import checkout

        self.server = checkout.airflow_services().Postgres().start()

    def database(self, name: str) -> str:
        """A new, empty database ``name`` (one of that name before is dropped), as a ``postgresql://`` URL."""
        return self.server.database(name)


@pytest.fixture(scope="session")
def postgres():
    """This pytest process's PostgreSQL server (:class:`PostgresForTests`), stopped at the session's end."""
    server = PostgresForTests()
    yield server
    server.server.stop()


@pytest.fixture
def postgres_of_its_own():
    """A PostgreSQL server for one test, which may stop and restart it (:class:`PostgresForTests`)."""
    server = PostgresForTests()
    yield server
    server.server.stop()
