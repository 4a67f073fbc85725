"""A real Airflow for tests and benchmarks: api-server, scheduler and dag-processor as processes of this
checkout, with their own AIRFLOW_HOME (config rendered by scripts/render_airflow_cfg.py: the preloading
LocalExecutor, SQLite), pools from resources.yaml and a signing key; and the REST calls to trigger a run
and wait for it. Used by tests/integration/test_under_the_executor.py, test_rest_api.py, the cluster
profile's tests, bench/orchestration.py and bench/scheduler.py."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))
from trainyard_airflow.team_dags import IN_PROCESS_ENV, bundle_teams  # noqa: E402

# The test suite keeps 2 cores busy for its whole length and asserts no latency, so its Airflows are made
# quieter than the product's; the benchmarks keep the product's settings.
# - The rendered config's scheduler looks for work every 0.2 s when idle (a short gap between one task and
#   the next); that costs it 11 % of a core while nothing runs, 3 % at Airflow's default of 1 s (measured:
#   6.7 and 1.8 CPU-seconds a minute).
# - Its dag-processor parses every DAG file of every bundle again every 30 s (a new retraining job file
#   becomes a DAG within that time): 21 files in multi-team mode with four teams, 35 % of a core for an
#   idle Airflow, 10 % once they are parsed only at start (measured with every process polled, short-lived
#   parsers included: 31.3 and 8.7 CPU-seconds in 90 s). A test that adds or edits a job file has the
#   bundle parsed then (`airflow dags reserialize`, see Airflow.parse).
QUIETER_FOR_TESTS = {
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "1",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3600",
}


# A request to a test's Airflow (a trigger, a token, a log, a look) waits this long for its answer. The suite's
# Airflows share 2 busy cores with the trainings they run: on CI's host a trigger once took over 30 s to be
# answered. A trigger is not repeated after a timeout, since the run may have been made all the same.
PATIENT_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A throwaway PostgreSQL server (the Debian package's binaries) for one Airflow: its own data folder,
    on 127.0.0.1 at a free port, trust authentication, database ``airflow``. PostgreSQL refuses to run as
    root, so as root its processes run as the ``postgres`` user the package creates."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError(
                "PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/initdb); "
                "`make setup` installs it (apt-get install postgresql)"
            )
        self.bin = Path(found[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="trainyard-pg-"))
        self.port = _free_port()
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/airflow"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_postgres, *argv], check=True, capture_output=True, text=True, cwd=self.dir)

    def start(self) -> Postgres:
        data = self.dir / "data"
        if self.as_postgres:
            self.dir.chmod(0o755)
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start_server()
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "airflow")
        return self

    def start_server(self) -> None:
        """The server on its data folder (made by :meth:`start`): after :meth:`stop_server`, a restart."""
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        data, log = str(self.dir / "data"), str(self.dir / "log")
        self._run(str(self.bin / "pg_ctl"), "-D", data, "-o", options, "-l", log, "-w", "start")

    def stop_server(self) -> None:
        """Stop the server (its connections are cut), keeping its data."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")

    def database(self, name: str) -> str:
        """A new, empty database ``name`` on this server (one of that name before is dropped), as a
        ``postgresql://`` URL."""
        import psycopg2

        admin = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            admin.close()
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop_server()
        shutil.rmtree(self.dir, ignore_errors=True)


class Airflow:
    def __init__(self, home: Path, trainyard_home: Path, database: str | None = None):
        """``database``: a SQLAlchemy URL for Airflow's metadata (default: SQLite in ``home``)."""
        self.home = home
        self.port = _free_port()
        self.url = f"http://localhost:{self.port}"
        bindir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "TRAINYARD_HOME": str(trainyard_home),
            "TRAINYARD_API_PORT": str(self.port),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)  # this Airflow's own database (xdist sets one)
        for name in IN_PROCESS_ENV:  # the rendered config's (the in-process tests turn multi-team mode off)
            self.env.pop(name, None)
        if database:
            self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = database
        self.procs: list[subprocess.Popen] = []

    def run(self, *argv):
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, cwd=REPO, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr[-3000:]}")

    def setup(self, users: str | None = None):
        """Config, database, pools and a signing key; ``users`` (``name:role,...``) replaces the simple auth
        manager's users of the rendered config."""
        self.run(sys.executable, "scripts/render_airflow_cfg.py")
        if users is not None:
            cfg = self.home / "airflow.cfg"
            cfg.write_text(
                cfg.read_text().replace(
                    "simple_auth_manager_users = admin:admin,operator:op,viewer:viewer",
                    f"simple_auth_manager_users = {users}",
                )
            )
        self.run("airflow", "db", "migrate")
        self.run("airflow", "teams", "sync")  # the teams whose bundles the config lists
        pools = subprocess.run(
            ["trainyard", "pools", "--format", "airflow"], env=self.env, check=True, capture_output=True, text=True
        ).stdout
        (self.home / "pools.json").write_text(pools)
        self.run("airflow", "pools", "import", str(self.home / "pools.json"))
        self.run("trainyard", "models", "keygen", "--if-missing")  # registered versions are signed

    def parse(self, bundle: str) -> None:
        """Parse the DAG bundle ``bundle`` now and store its DAGs (what the dag-processor does for each file
        every ``min_file_process_interval``), e.g. once a retraining job file was added or edited."""
        self.run("airflow", "dags", "reserialize", "--bundle-name", bundle)

    def teams(self) -> list[str]:
        """The teams that own a DAG bundle (the rendered config's, scripts/render_airflow_cfg.py)."""
        return bundle_teams(self.home)

    def start(self, triggerer: bool = True, teams: Iterable[str] | None = None):
        """The api-server, scheduler, dag-processor and (unless told not to) the triggerers, the shared one
        and one per team (a team's deferred tasks wait only in its own): a job that waits for admission
        waits deferred. ``teams``: only these teams' triggerers, and no shared one (a test whose jobs are of
        these teams only: in multi-team mode the shared bundle makes no DAG, so nothing defers to the shared
        triggerer; an idle triggerer takes about 0.7 CPU-seconds a minute)."""
        components = {  # log name -> the airflow command
            "api-server": ["api-server", "--port", str(self.port)],
            "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"],
        }
        if triggerer:
            if teams is None:
                components["triggerer"] = ["triggerer"]
            wanted = None if teams is None else set(teams)
            served = [t for t in self.teams() if wanted is None or t in wanted]
            if wanted is not None and set(served) != wanted:
                raise ValueError(f"no DAG bundle for team(s) {sorted(wanted - set(served))}: no triggerer for them")
            for i, team in enumerate(served):  # one triggerer serves the triggers' logs (one server per port)
                quiet = ["--skip-serve-logs"] if teams is None or i > 0 else []
                components[f"triggerer-{team}"] = ["triggerer", "--team-name", team, *quiet]
        for name, command in components.items():
            argv = ["airflow", *command]
            # the child holds its own copy of the descriptor, so ours can close once it has started
            with open(self.home / f"{name}.log", "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
                    )
                )
        self.wait(lambda: requests.get(f"{self.url}/api/v2/monitor/health", timeout=5).ok, 600, "API server")

    def stop(self, wait_s: float = 10):
        """SIGTERM to every process of every component's session (its own, and what it started in process
        groups of their own: the task processes the executor forks, which a group's signal would leave
        running their trainings); what is still there after ``wait_s`` in all (a throwaway installation:
        nothing to wait for) gets SIGKILL."""
        sessions = {p.pid for p in self.procs}

        def left() -> list[int]:
            found = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):  # ended meanwhile
                        zombie = (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z"
                        if not zombie and os.getsid(int(entry.name)) in sessions:
                            found.append(int(entry.name))
            return found

        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n" + f.read_text()[-3000:] for f in sorted(self.home.glob("*.log")))

    def dead(self) -> list[str]:
        """The services that have exited."""
        return [" ".join(p.args[1:4]) for p in self.procs if p.poll() is not None]

    def wait(self, predicate, seconds, what):
        """Until ``predicate()`` is true; an AssertionError with the logs on timeout, or as soon as one of
        the services has exited."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            dead = self.dead()
            if dead:
                raise AssertionError(f"Airflow's {', '.join(dead)} exited while waiting for {what}\n{self.logs()}")
            try:
                if predicate():
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def token(self, user: str) -> str:
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        r = requests.post(
            f"{self.url}/auth/token",
            json={"username": user, "password": passwords[user]},
            timeout=PATIENT_SECONDS,
        )
        assert r.status_code == 201, r.text
        return r.json()["access_token"]

    def headers(self, user: str = "admin") -> dict:
        return {"Authorization": f"Bearer {self.token(user)}"}

    def trigger(self, dag_id: str, conf: dict, headers: dict) -> str:
        r = requests.post(
            f"{self.url}/api/v2/dags/{dag_id}/dagRuns",
            headers=headers,
            json={"logical_date": None, "conf": conf},
            timeout=PATIENT_SECONDS,
        )
        r.raise_for_status()
        return r.json()["dag_run_id"]

    def wait_run(self, dag_id: str, run_id: str, headers: dict, seconds: float = 900) -> dict:
        state = {}

        def done():
            r = requests.get(f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}", headers=headers, timeout=10)
            state["run"] = r.json()
            return r.json()["state"] in ("success", "failed")

        self.wait(done, seconds, f"run {run_id}")
        return state["run"]

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, headers: dict, attempt: int = 1, map_index: int = -1
    ) -> str:
        r = requests.get(
            f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{attempt}",
            headers={**headers, "Accept": "application/json"},
            params={"map_index": map_index},
            timeout=PATIENT_SECONDS,
        )
        r.raise_for_status()
        return r.text

    def failure_report(self, dag_id: str, run_id: str, headers: dict) -> str:
        """The states, then the log of every try of every failed task and the tails of the Airflow
        processes' own logs: what a test prints when a run did not end as it expected."""
        tis = self.task_instances(dag_id, run_id, headers)
        lines = [str({t: ti["state"] for t, ti in tis.items()})]
        for key, ti in tis.items():
            if ti["state"] != "failed":
                continue
            for attempt in range(1, max(ti.get("try_number") or 1, 1) + 1):
                try:
                    text = self.task_log(dag_id, run_id, ti["task_id"], headers, attempt, ti["map_index"])[-4000:]
                except requests.RequestException as err:  # the report must not hide the failure it reports
                    text = f"(could not fetch it: {err})"
                lines.append(f"--- log of {key}, try {attempt}\n{text}")
        lines.append(self.logs())
        return "\n".join(lines)

    def error_lines(self, dag_id: str, run_id: str, headers: dict) -> dict[str, list[str]]:
        """The lines each successful task of the run logged as ERROR (its last try's log): what Airflow's
        log view shows in red, and where a library writing to stderr lands."""
        found = {}
        for name, ti in self.task_instances(dag_id, run_id, headers).items():
            if ti["state"] != "success":
                continue
            r = requests.get(
                f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}",
                headers={**headers, "Accept": "application/json"},
                params={"map_index": ti["map_index"]},
                timeout=30,
            )
            r.raise_for_status()
            entries = [e for e in r.json()["content"] if isinstance(e, dict) and "level" in e]
            assert entries, f"{name}'s log has no line with a level: {r.text[:500]}"  # else nothing is checked
            found[name] = [str(e.get("event"))[:300] for e in entries if e["level"] == "error"]
        return found

    def task_instances(self, dag_id: str, run_id: str, headers: dict) -> dict:
        """The run's task instances by task id; a mapped one's as ``task_id[map_index]``."""
        r = requests.get(
            f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
            headers=headers,
            params={"limit": 1000},
            timeout=10,
        )
        return {
            ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]": ti
            for ti in r.json()["task_instances"]
        }


class OnCluster(Airflow):
    """The same helpers pointed at a running cluster profile (scripts/cluster.py ``Cluster``): its
    api-server, its environment for the ``trainyard`` and ``airflow`` commands, its services' logs. A wait
    ends as soon as one of its Airflow components, MLflow or Redis has exited (a worker may be killed on
    purpose; PostgreSQL is watched by what uses it)."""

    def __init__(self, cluster) -> None:
        super().__init__(cluster.airflow_home, cluster.trainyard_home)
        self.cluster, self.url, self.port = cluster, cluster.api_url, cluster.ports["api"]
        self.env = cluster.process_env()

    def dead(self) -> list[str]:
        return self.cluster.exited()

    def logs(self) -> str:
        return self.cluster.log_tails()
