"""The cluster profile on one machine: trainyard on the engines a team shares, as separate processes.

    python scripts/cluster.py up|down|status|env      (make up-cluster / down-cluster / cluster-status)
    python scripts/cluster.py up --hosts 2            (GPU hosts of their own: a job of several nodes across them)

``up`` starts, each only if it is not running yet, every service on 127.0.0.1 only (or on the address of the
cluster's :class:`Network`, where workers run on hosts of their own):

- PostgreSQL (the Debian package's binaries): database ``airflow`` (Airflow's metadata and Celery's
  results), ``mlflow`` (the tracking server's backend store), ``mlflow_auth`` (its users, roles and
  grants) and ``trainyard`` (the admission ledger, ``TRAINYARD_DATABASE_URL``);
- Redis, the Celery broker (append-only file: queued tasks survive a restart);
- an MLflow tracking server that stores and serves the artifacts (``--serve-artifacts``) and runs MLflow's
  auth app: each Airflow user logs into it with their Airflow password and reads only their teams'
  experiments, runs and models (``trainyard.tracking.mlflow_auth``; the tasks log as a service account);
- Airflow with the CeleryExecutor: api-server, scheduler, dag-processor, triggerer, and two Celery workers:
  one on queue ``cpu`` (every task but the trainings), and a GPU host's (``trainyard worker``) on the
  training queue of each GPU type this machine's ``TRAINYARD_GPU_DEVICES`` lists (``gpu-<type>``: the
  trainings of a type go only to the hosts that have it), the ``cpu`` type's alone where it is unset.

Everything lives under one folder (``$TRAINYARD_CLUSTER_DIR``, default ``var/cluster``): the databases,
the broker's file, the artifacts, ``trainyard/`` (TRAINYARD_HOME: datasets, runs and checkpoints, which
every worker reads and writes; on several hosts, a shared volume), logs and pid files. ``down`` stops the
processes and keeps it all; the next ``up`` finds every run, model and queued job where it was.

Nothing in the pipeline differs between the profiles: only the environment does (``env`` prints it, to
``source`` for the ``trainyard`` and ``airflow`` commands). Loopback is not one user: PostgreSQL and Redis
ask for passwords made on the first ``up`` (``secrets.json``, mode 0600), and no password is put on a
command line. docs/running-at-scale.md says what a shared deployment uses instead.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainyard.scheduling.hosts import ADDRESS_ENV as HOST_ADDRESS_ENV
from trainyard.spec import MAX_HOURS_LIMIT
from trainyard.tracking import mlflow_auth

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))  # where Airflow finds trainyard_airflow (it is not installed)
from trainyard_airflow.team_dags import IN_PROCESS_ENV, bundle_teams  # noqa: E402

DEFAULT_PORTS = {"postgres": 5433, "redis": 6380, "mlflow": 5001, "api": 8081}
DATABASES = ("airflow", "mlflow", "mlflow_auth", "trainyard")
MLFLOW_SERVICE_USER = "trainyard"  # the tasks' account on the tracking server (its auth app's admin)
# A Celery task (a training holds one for its whole length) that the broker has not seen acknowledged in this
# long is delivered again, to a second worker, while the first still trains (apache/airflow#62218): it
# must outlast the longest training a JobSpec may ask for, plus an hour of queueing and set-up.
VISIBILITY_TIMEOUT_S = int(MAX_HOURS_LIMIT * 3600 + 3600)


@dataclass(frozen=True)
class Worker:
    """A Celery worker: of ``queues`` (``airflow celery worker``), or a GPU host serving the GPU types its
    inventory ``gpus`` lists (``trainyard worker``, ``TRAINYARD_GPU_DEVICES``; :data:`THIS_MACHINE`: this
    machine's, else the ``cpu`` type's alone). ``own_host``: in a network namespace of its own, with its own
    address (the cluster's :class:`Network`), as a separate machine would be."""

    concurrency: int = 1
    queues: str = ""
    gpus: str = ""
    own_host: bool = False


@dataclass(frozen=True)
class Network:
    """Hosts of their own on this one machine: a bridge that holds the services' address (``<prefix>.1``),
    and for each worker with ``own_host`` a network namespace joined to it by a veth pair, with an address of
    its own (``<prefix>.<10 + i>``). What runs in a namespace reaches the services and the other hosts, not
    this machine's loopback. Needs root and ``ip`` (iproute2). ``name``: a short tag of this cluster's, in
    the names of its bridge, namespaces and links (an interface name holds at most 15 characters)."""

    name: str = "ty"
    prefix: str = "10.213.7"

    @property
    def address(self) -> str:
        return f"{self.prefix}.1"

    def named(self, what: str) -> str:
        """This network's name for ``what``: its bridge (``br``), a veth link, a host's namespace."""
        return f"{self.name}-{what}"

    @staticmethod
    def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)

    def up(self) -> None:
        """The bridge with the services' address (once)."""
        if self._ip("link", "show", self.named("br"), check=False).returncode == 0:
            return
        self._ip("link", "add", self.named("br"), "type", "bridge")
        self._ip("addr", "add", f"{self.address}/24", "dev", self.named("br"))
        self._ip("link", "set", self.named("br"), "up")

    def add_host(self, host: str, index: int) -> tuple[str, str]:
        """Host ``host``'s namespace and address (made once): the ``index``-th host of the cluster."""
        namespace, address = self.named(host), f"{self.prefix}.{10 + index}"
        made = self._ip("-n", namespace, "-4", "-o", "addr", "show", "eth0", check=False)
        if made.returncode == 0 and made.stdout.split():  # made before (by another `up`): its own address
            return namespace, made.stdout.split()[3].split("/")[0]
        self._ip("netns", "del", namespace, check=False)  # one left half made
        link = self.named(f"v{index}")
        self._ip("link", "del", link, check=False)  # a link left by a namespace deleted by hand
        self._ip("netns", "add", namespace)
        self._ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        self._ip("link", "set", link, "master", self.named("br"), "up")
        self._ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        self._ip("-n", namespace, "link", "set", "eth0", "up")
        self._ip("-n", namespace, "link", "set", "lo", "up")
        return namespace, address

    def down(self) -> None:
        """Every namespace of this cluster's and its bridge (their links go with them)."""
        listed = self._ip("netns", "list", check=False).stdout.split("\n")
        for namespace in (line.split()[0] for line in listed if line.startswith(f"{self.name}-")):
            self._ip("netns", "del", namespace, check=False)
        self._ip("link", "del", self.named("br"), check=False)


THIS_MACHINE = "this machine's"
WORKERS = {"worker-cpu": Worker(2, queues="cpu"), "worker-gpu": Worker(1, gpus=THIS_MACHINE)}
TASK_HEARTBEAT_TIMEOUT_S = 20  # a dead worker's try fails after this (Airflow's default: 300)
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
SERVICES = ("redis", "mlflow", *AIRFLOW_COMPONENTS)  # besides PostgreSQL and the workers
PASSED_ON = (signal.SIGTERM, signal.SIGINT)  # the signals a service's supervisor passes on to it


class ToolFailed(subprocess.CalledProcessError):
    """A service's tool exited with an error; its message says what the tool printed."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or self.stdout or '').strip()}"


def process_start(pid: int) -> str:
    """When process ``pid`` started, as this boot's id and the clock ticks from boot to its start (Linux's
    /proc): what tells it from a later process given the same pid. Not the wall-clock start psutil gives,
    which moves whenever the system clock is set (an NTP step), and would make running services look gone.
    ProcessLookupError where there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    ticks = stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime (the command before it may hold spaces)
    return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()}/{ticks}"


class Cluster:
    def __init__(
        self,
        root: Path,
        ports: dict[str, int] | None = None,
        settings: dict[str, str] | None = None,
        workers: dict[str, Worker] | None = None,
        network: Network | None = None,
    ):
        """``root``: the folder that holds everything; ``ports``: overrides of DEFAULT_PORTS; ``settings``:
        more environment (Airflow settings as ``AIRFLOW__SECTION__KEY``) for every process; ``workers``:
        the Celery workers ``up`` starts, by name (default WORKERS); ``network``: hosts of their own for the
        workers that ask for one, and the services on its address instead of loopback."""
        self.root = root.resolve()
        self.workers = workers or WORKERS
        self.network = network
        self.address = network.address if network else "127.0.0.1"  # where every service listens
        self.hosts: dict[str, str] = {}  # the workers on hosts of their own: name -> namespace
        self.ports = {**DEFAULT_PORTS, **(ports or {})}
        self.settings = settings or {}
        self.logs, self.pids = self.root / "logs", self.root / "pids"
        self.airflow_home, self.trainyard_home = self.root / "airflow", self.root / "trainyard"
        self.pg_data = self.root / "postgres" / "data"

    # -- where things are -------------------------------------------------------------------------------

    def secret(self, name: str) -> str:
        """The profile's password for ``name`` (``postgres``, ``redis``), made on first use and kept in
        ``secrets.json`` (mode 0600): loopback is not one user, so the database and the broker ask for it."""
        import secrets

        path = self.root / "secrets.json"
        self.root.mkdir(parents=True, exist_ok=True)
        known = json.loads(path.read_text()) if path.exists() else {}
        if name not in known:
            known[name] = secrets.token_urlsafe(24)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(known, fh)
        return known[name]

    def database_url(self, name: str, driver: str = "postgresql") -> str:
        return f"{driver}://postgres:{self.secret('postgres')}@{self.address}:{self.ports['postgres']}/{name}"

    @property
    def api_url(self) -> str:
        return f"http://{self.address}:{self.ports['api']}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.address}:{self.ports['mlflow']}"

    def env(self) -> dict[str, str]:
        """The environment that makes Airflow and trainyard the cluster profile (nothing else differs)."""
        return {
            "AIRFLOW_HOME": str(self.airflow_home),
            "TRAINYARD_HOME": str(self.trainyard_home),
            "TRAINYARD_DATABASE_URL": self.database_url("trainyard"),
            "TRAINYARD_API_PORT": str(self.ports["api"]),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            # trainyard's service account on the tracking server (its auth app's admin): the tasks log and
            # register as it; users read what their teams' roles are granted (trainyard.tracking.mlflow_auth)
            "MLFLOW_TRACKING_USERNAME": MLFLOW_SERVICE_USER,
            "MLFLOW_TRACKING_PASSWORD": self.secret("mlflow"),
            "AIRFLOW_API_URL": self.api_url,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url("airflow", "postgresql+psycopg2"),
            "AIRFLOW__CELERY__BROKER_URL": f"redis://:{self.secret('redis')}@{self.address}:{self.ports['redis']}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": self.database_url("airflow", "db+postgresql+psycopg2"),
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S),
            # the workers import the heavy libraries once, before forking their pool (trainyard_airflow.celery_config)
            "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "trainyard_airflow.celery_config.CELERY_CONFIG",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": "cpu",
            "AIRFLOW__TRAINYARD__TRAINING_QUEUE": "gpu",
            # A try whose worker died (its host lost) fails once the scheduler has not heard its supervisor for
            # this long, and its retry starts on another host: 300 s by default. The supervisor, a process of
            # its own beside the training, beats every [workers] min_heartbeat_interval (5 s) however long a
            # step or a checkpoint takes: four beats missed in a row, not a slow training, fail it.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(TASK_HEARTBEAT_TIMEOUT_S),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__API__HOST": self.address,
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            **self.settings,
        }

    def process_env(self) -> dict[str, str]:
        """This process's environment with :meth:`env` over it and this Python's bin first: what every
        service runs with, and what a client of the cluster (the ``trainyard`` command) needs."""
        env = {k: v for k, v in os.environ.items() if k not in IN_PROCESS_ENV}  # the rendered config's
        env = {**env, **self.env()}
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return env

    # -- processes --------------------------------------------------------------------------------------

    def pid(self, name: str) -> int | None:
        """The pid of a running service ``name``, or None. Its pid file holds the pid and the process's
        :func:`process_start`: a pid the system gave to another process since (after a reboot) is not taken
        for it."""
        import psutil

        try:
            pid, started = (self.pids / f"{name}.pid").read_text().split()
            proc = psutil.Process(int(pid))
            if "/" in started:
                same = process_start(proc.pid) == started
            else:  # a pid file of an earlier trainyard: the wall-clock start psutil gives
                same = abs(proc.create_time() - float(started)) <= 1
            if not same or proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except (FileNotFoundError, ProcessLookupError, ValueError, psutil.Error):
            return None
        return proc.pid

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, namespace: str = "") -> None:
        """Start service ``name`` under :func:`supervise` (its pid file names the supervisor), in network
        namespace ``namespace`` if one is named (``ip netns exec`` execs it there: the pid is the same)."""
        if self.pid(name):
            return
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        inside = ["ip", "netns", "exec", namespace] if namespace else []
        with open(self.logs / f"{name}.log", "a") as log:
            proc = subprocess.Popen(
                [*inside, sys.executable, str(Path(__file__).resolve()), "supervise", name, "--", *argv],
                env={**self.process_env(), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        (self.pids / f"{name}.pid").write_text(f"{proc.pid} {process_start(proc.pid)}")

    def kill(self, *names: str, sig: int = signal.SIGTERM, wait_s: float = 60) -> None:
        """Send ``sig`` to the services ``names`` (through their supervisors) and to every process under
        them, all at once, and SIGKILL what is left after ``wait_s``. Every process, not only a service's
        session: Airflow's task supervisor puts each task in a process group of its own and the launcher
        starts torchrun in a session of its own, and a training left running would hold its lease and write
        into its run beside the retry."""
        import psutil

        procs, told = [], []
        for name in names:
            pid = self.pid(name)
            with contextlib.suppress(psutil.NoSuchProcess):
                if pid is not None:
                    supervisor = psutil.Process(pid)
                    service = supervisor.children()
                    below = [p for p in supervisor.children(recursive=True) if p not in service]
                    procs += [supervisor, *service, *below]
                    # the supervisor passes a stop on to its service (a SIGKILL it cannot)
                    told += [supervisor, *below] if sig in PASSED_ON else [supervisor, *service, *below]
        for p in told:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(procs, timeout=wait_s)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        for name in names:
            (self.pids / f"{name}.pid").unlink(missing_ok=True)

    def _run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, env=self.process_env(), cwd=REPO, check=True, capture_output=True, text=True, **kwargs
        )

    # -- PostgreSQL and Redis ---------------------------------------------------------------------------

    def _pg(self, tool: str, *args: str, login: bool = False) -> subprocess.CompletedProcess:
        """PostgreSQL's ``tool`` as the postgres user; ``login``: a client that connects (the password)."""
        found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))
        if not found:
            raise SystemExit("PostgreSQL's server is not installed: `make setup` installs it (apt-get postgresql)")
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        env = {**os.environ, **({"PGPASSWORD": self.secret("postgres")} if login else {})}
        done = subprocess.run([*as_postgres, found[-1], *args], capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise ToolFailed(done.returncode, done.args, done.stdout, done.stderr)
        return done

    def _let_postgres_in(self) -> None:
        """As root the server runs as the postgres user, which must search every directory down to its data.
        The default place, ``var/cluster``, is inside TRAINYARD_HOME, which the set-up closes to other users
        (the custom-command sandbox): a directory postgres cannot search gets one ACL entry, search for
        postgres alone, under the sandbox's ACL lock; each is said once."""
        if os.geteuid() != 0:
            return
        import pwd

        from trainyard.files import file_lock
        from trainyard.training.launchers.sandbox import STATE_DIR

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise SystemExit("no postgres user: PostgreSQL's server is missing (`make setup` installs it)") from None

        def searchable(directory: Path) -> bool:
            probe = ["runuser", "-u", "postgres", "--", "test", "-x", str(directory)]
            return subprocess.run(probe, check=False, capture_output=True).returncode == 0

        way = list(reversed(self.pg_data.parent.resolve().parents))  # from / down
        if searchable(way[-1]):  # reached: so was every directory above it
            return
        if shutil.which("setfacl") is None:
            raise SystemExit(
                f"{way[-1]} is out of the postgres user's reach and setfacl is missing: `make setup` installs it "
                "(apt-get install acl), or set TRAINYARD_CLUSTER_DIR to a directory others may search"
            )
        STATE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        with file_lock(STATE_DIR / "acl.lock"):
            for directory in way:  # top down: a directory below a closed one is judged once that one is open
                if searchable(directory):
                    continue
                # the mask as it is where it lets search through (a 0750 var); a mask without x (a 0700
                # directory) is widened to x, which is all the named entries of the group class can gain
                for argv in (["setfacl", "-n", "-m"], ["setfacl", "-m"]):
                    done = subprocess.run([*argv, "u:postgres:x", str(directory)], check=False, capture_output=True,
                                          text=True)  # fmt: skip
                    if done.returncode != 0 or searchable(directory):
                        break
                if done.returncode != 0 or not searchable(directory):
                    raise SystemExit(
                        f"could not let the postgres user search {directory} (setfacl: {done.stderr.strip() or 'ok'};"
                        " a mask or group bits without x?): set TRAINYARD_CLUSTER_DIR to a directory others may search"
                    )
                print(f"[cluster] the postgres user may now search {directory} (ACL u:postgres:x)", file=sys.stderr)

    def start_postgres(self) -> None:
        """PostgreSQL, the first service up: the network whose address the services listen on comes first."""
        if self.network is not None:
            self.network.up()
        self.pg_data.parent.parent.mkdir(parents=True, exist_ok=True)
        self._let_postgres_in()
        if not (self.pg_data / "PG_VERSION").exists():
            self.pg_data.mkdir(parents=True, exist_ok=True)
            # its socket folder and data: the postgres user's only (PostgreSQL refuses to run as root)
            self.pg_data.parent.chmod(0o700)
            if os.geteuid() == 0:
                for d in (self.pg_data.parent, self.pg_data):
                    shutil.chown(d, "postgres", "postgres")
            pwfile = self.pg_data.parent / "initdb.pw"
            fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.secret("postgres"))
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            try:
                self._pg("initdb", "-D", str(self.pg_data), "-U", "postgres", "--auth=scram-sha-256",
                         f"--pwfile={pwfile}", "-E", "UTF8")  # fmt: skip
            finally:
                pwfile.unlink()
        if self._pg_running():
            return
        socket_dir = self.pg_data.parent
        options = f"-p {self.ports['postgres']} -k {socket_dir} -c listen_addresses={self.address}"
        if self.network is not None:  # the hosts of their own connect from the network's addresses
            hba = self.pg_data / "pg_hba.conf"
            line = f"host all all {self.network.prefix}.0/24 scram-sha-256"
            if line not in hba.read_text().splitlines():
                with open(hba, "a") as fh:
                    fh.write(line + "\n")
        log = self.pg_data.parent / "postgres.log"
        self._pg("pg_ctl", "-D", str(self.pg_data), "-o", options, "-l", str(log), "-w", "start")
        for db in DATABASES:
            with contextlib.suppress(subprocess.CalledProcessError):  # made by an earlier `up`
                port = str(self.ports["postgres"])
                self._pg("createdb", "-h", self.address, "-p", port, "-U", "postgres", db, login=True)

    def _pg_running(self) -> bool:
        try:
            self._pg("pg_ctl", "-D", str(self.pg_data), "status")
        except subprocess.CalledProcessError:
            return False
        return True

    def stop_postgres(self) -> None:
        if (self.pg_data / "PG_VERSION").exists() and self._pg_running():
            self._pg("pg_ctl", "-D", str(self.pg_data), "-m", "fast", "-w", "stop")

    def start_redis(self) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("Redis is not installed: `make setup` installs it (apt-get install redis-server)")
        data = self.root / "redis"
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        conf = data / "redis.conf"  # the password in a file of the owner's, not on a command line ps shows
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(
                f'bind {self.address}\nport {self.ports["redis"]}\ndir {data}\nappendonly yes\nsave ""\n'
                f"protected-mode yes\nrequirepass {self.secret('redis')}\n"
            )
        self._spawn("redis", ["redis-server", str(conf)])
        _wait_port(self.address, self.ports["redis"], 30, "Redis")

    # -- MLflow and Airflow -----------------------------------------------------------------------------

    def start_mlflow(self) -> None:
        port = self.ports["mlflow"]
        artifacts = self.root / "mlflow-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        auth = mlflow_auth.write_config(  # MLflow's auth app: a user reads only what their teams are granted
            self.root / "mlflow_auth.ini",
            self.database_url("mlflow_auth", "postgresql+psycopg2"),
            MLFLOW_SERVICE_USER,
            self.secret("mlflow"),
        )
        self._spawn(  # its store's URL (with the password) by environment, not on the command line
            "mlflow",
            ["mlflow", "server", "--app-name", "basic-auth", "--host", self.address, "--port", str(port),
             "--serve-artifacts", "--artifacts-destination", str(artifacts),
             "--allowed-hosts", f"{self.address}:{port},localhost:{port}", "--workers", "2"],
            {
                **mlflow_auth.server_env(auth, self.secret("mlflow_csrf")),
                "MLFLOW_BACKEND_STORE_URI": self.database_url("mlflow", "postgresql+psycopg2"),
                # its job runner (seven huey consumers) serves GenAI features trainyard does not use
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
        )  # fmt: skip

    def setup_airflow(self) -> None:
        """Config, database schema, pools, the signing key: each idempotent."""
        self.trainyard_home.mkdir(parents=True, exist_ok=True)
        self._run([sys.executable, "scripts/render_airflow_cfg.py"])
        self._run(["airflow", "db", "migrate"])
        self._run(["airflow", "teams", "sync"])  # the teams whose DAG bundles the config lists
        self._run(["trainyard", "pools", "sync"])
        self._run(["trainyard", "models", "keygen", "--if-missing"])

    def start_airflow(self) -> None:
        for name in AIRFLOW_COMPONENTS:
            argv = ["airflow", name]
            if name == "api-server":
                argv += ["--port", str(self.ports["api"])]
            if name == "triggerer":
                argv += ["--skip-serve-logs"]  # its log server would listen on every interface
            self._spawn(name, argv)
        for team in self.teams():  # a team's deferred tasks wait only in its own triggerer (multi-team mode)
            self._spawn(f"triggerer-{team}", ["airflow", "triggerer", "--skip-serve-logs", "--team-name", team])
        for name, worker in self.workers.items():
            self.start_worker(name, worker)

    def teams(self) -> list[str]:
        """The teams that own a DAG bundle (the rendered config's, scripts/render_airflow_cfg.py)."""
        return bundle_teams(self.airflow_home)

    def services(self) -> tuple[str, ...]:
        """Redis, MLflow and Airflow's components, each team's triggerer included (PostgreSQL and the
        workers aside)."""
        return (*SERVICES, *(f"triggerer-{team}" for team in self.teams()))

    def start_worker(self, name: str, worker: Worker) -> None:
        """A Celery worker ``name`` (its own hostname; it serves no logs: the task logs are files under
        AIRFLOW_HOME that the api-server reads). A GPU host's serves its inventory's types' training queues
        and announces them in the ledger (``trainyard worker``), as host ``name``."""
        common = ["--skip-serve-logs", "--without-gossip", "--without-mingle"]
        if not worker.gpus:
            self._spawn(
                name,
                ["airflow", "celery", "worker", "--queues", worker.queues, "--concurrency", str(worker.concurrency),
                 "--celery-hostname", f"{name}@%h", *common],
            )  # fmt: skip
            return
        gpus = os.environ.get("TRAINYARD_GPU_DEVICES", "cpu=") if worker.gpus == THIS_MACHINE else worker.gpus
        extra = ["--queue", worker.queues] if worker.queues else []
        env, namespace = {"TRAINYARD_GPU_DEVICES": gpus}, ""
        if worker.own_host:
            if self.network is None:
                raise SystemExit(f"worker {name} asks for a host of its own, and the cluster has no Network")
            index = list(self.hosts).index(name) if name in self.hosts else len(self.hosts)
            namespace, address = self.network.add_host(name, index)
            self.hosts[name] = namespace
            env[HOST_ADDRESS_ENV] = address  # where the other nodes of a multi-node job reach it
        self._spawn(
            name,
            ["trainyard", "worker", "--name", name, "--concurrency", str(worker.concurrency), *extra, "--", *common],
            env=env,
            namespace=namespace,
        )

    # -- the whole ---------------------------------------------------------------------------------------

    def up(self, wait_s: float = 300) -> None:
        self.start_postgres()
        self.start_redis()
        self.start_mlflow()
        self.setup_airflow()
        self.start_airflow()
        self.wait_healthy(wait_s)
        self.sync_mlflow_users()

    def sync_mlflow_users(self) -> str:
        """Airflow's users, with their passwords and teams, told to MLflow's auth app (written by the
        api-server's first start, so after it is healthy): what ``trainyard_airflow.mlflow_users`` prints."""
        env = {**self.process_env(), "PYTHONPATH": str(REPO / "plugins")}
        done = subprocess.run(
            [sys.executable, "-m", "trainyard_airflow.mlflow_users"], env=env, cwd=REPO, check=True,
            capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout

    def down(self, wait_s: float = 60) -> None:
        """Stop Airflow (its workers, including any a test added, and its components), then MLflow and Redis,
        then PostgreSQL; each step's processes are given ``wait_s`` to end by themselves."""
        added = [f.stem for f in self.pids.glob("*.pid")] if self.pids.exists() else []
        others = [n for n in added if n not in ("mlflow", "redis")]
        airflow = dict.fromkeys([*self.workers, *AIRFLOW_COMPONENTS, *others])
        self.kill(*airflow, wait_s=wait_s)
        self.kill("mlflow", "redis", wait_s=wait_s)
        self.stop_postgres()
        if self.network is not None:
            self.network.down()
            self.hosts.clear()

    def status(self) -> dict[str, int | None]:
        running = {name: self.pid(name) for name in (*self.services(), *self.workers)}
        pidfile = self.pg_data / "postmaster.pid"
        running["postgres"] = int(pidfile.read_text().split()[0]) if self._pg_running() and pidfile.exists() else None
        return running

    def exited(self, *workers: str) -> list[str]:
        """Which of Redis, MLflow, Airflow's components and ``workers`` are not running (PostgreSQL aside:
        :meth:`status` has it)."""
        return [n for n in (*self.services(), *workers) if self.pid(n) is None]

    def wait_healthy(self, wait_s: float) -> None:
        """Until the api-server, the scheduler, the triggerer and the dag-processor report healthy and MLflow
        answers; SystemExit naming what is not, with its log's tail, after ``wait_s``."""
        import requests

        deadline = time.time() + wait_s
        last = ""
        while time.time() < deadline:
            dead = self.exited(*self.workers)
            if dead:
                raise SystemExit(f"{', '.join(dead)} exited:\n{self.log_tails(dead)}")
            try:
                health = requests.get(f"{self.api_url}/api/v2/monitor/health", timeout=5).json()
                mlflow = requests.get(f"{self.mlflow_url}/health", timeout=5).ok
            except (requests.RequestException, ValueError) as err:
                last = str(err)
            else:
                unhealthy = [k for k, v in health.items() if v.get("status") != "healthy"]
                if not unhealthy and mlflow:
                    return
                last = f"not healthy yet: {unhealthy or ['mlflow']}"
            time.sleep(2)
        raise SystemExit(f"the cluster did not come up in {wait_s:.0f} s ({last}):\n{self.log_tails()}")

    def log_tails(self, names: list[str] | None = None, chars: int = 3000) -> str:
        files = [self.logs / f"{n}.log" for n in names] if names else sorted(self.logs.glob("*.log"))
        return "\n".join(f"--- {f.name}\n{f.read_text()[-chars:]}" for f in files if f.exists())


RESTART_DELAYS_S = (1, 2, 5, 10, 30)  # after each exit in a row; a run of STEADY_S starts it over
STEADY_S = 60


def supervise(name: str, argv: list[str]) -> int:
    """Run ``argv`` and start it again whenever it exits, as Kubernetes or systemd keeps a service up:
    Airflow's scheduler, dag-processor and triggerer exit when their database goes away (a PostgreSQL
    restart), and a platform whose scheduler stays down stops. After ``len(RESTART_DELAYS_S)`` exits in a
    row, each within STEADY_S of its start, it gives up (a service that cannot start: a port taken, a bad
    setting), so the service is seen to be down. SIGTERM or SIGINT is passed on and ends both. Each exit
    and restart is written to the service's log."""
    stopping = False
    child: subprocess.Popen | None = None
    signals = set(PASSED_ON)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in signals:
        signal.signal(sig, stop)
    failures, code = 0, 0
    while not stopping:
        started = time.monotonic()
        # a stop that arrives while the child is being started waits until it has one to pass on to
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            if stopping:
                break
            # (the child starts with them unblocked: a mask is inherited)
            child = subprocess.Popen(argv, preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, signals))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        code = child.wait()
        if stopping:
            break
        failures = 0 if time.monotonic() - started >= STEADY_S else failures + 1
        if failures > len(RESTART_DELAYS_S):
            print(f"[cluster] {name} exited with {code}, {failures} times in a row; giving up", flush=True)
            break
        delay = RESTART_DELAYS_S[max(failures, 1) - 1]
        print(f"[cluster] {name} exited with {code}; starting it again in {delay} s", flush=True)
        time.sleep(delay)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says


def _wait_port(address: str, port: int, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} is not listening on {address}:{port} after {seconds:.0f} s")


HOSTS_FILE = "hosts.json"  # how many GPU hosts of their own the last `up --hosts N` started


def in_folder(root: Path, hosts: int | None = None) -> Cluster:
    """The profile whose folder is ``root``. ``hosts``: that many GPU hosts, each in a network namespace of its
    own with its own address (``up --hosts N``: a job of several nodes trains across them), kept in the folder
    for the commands after it; None: as the last ``up`` left it (0: this machine's one GPU host)."""
    path = root / HOSTS_FILE
    before = json.loads(path.read_text())["hosts"] if path.exists() else 0
    if hosts is not None and hosts != before and Cluster(root).pid("api-server") is not None:
        raise SystemExit(
            f"the cluster in {root} runs with {before} host(s) of their own: `make down-cluster` first (it takes "
            "their network namespaces down), then up again with the hosts you want"
        )
    hosts = before if hosts is None else hosts
    if not hosts:
        path.unlink(missing_ok=True)
        return Cluster(root)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise SystemExit("--hosts: hosts of their own are network namespaces, which need root and iproute2 (ip)")
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hosts": hosts}))
    own = {f"gpu-host-{i}": Worker(1, gpus=THIS_MACHINE, own_host=True) for i in range(1, hosts + 1)}
    return Cluster(root, workers={"worker-cpu": WORKERS["worker-cpu"], **own}, network=Network())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["supervise"] and "--" in argv:  # how _spawn starts every service
        return supervise(argv[1], argv[argv.index("--") + 1 :])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="up: GPU hosts, each in a network namespace of its own (root): a job of several nodes trains across "
        "them; kept for the later commands (default: as the last up; 0: this machine's one GPU host)",
    )
    args = parser.parse_args(argv)
    if args.hosts is not None and (args.command != "up" or not 0 <= args.hosts <= 200):
        parser.error("--hosts goes with up, and takes 0 to 200")
    cluster = in_folder(Path(os.environ.get("TRAINYARD_CLUSTER_DIR", REPO / "var" / "cluster")), args.hosts)
    if args.command == "up":
        cluster.up()
        print(f"Airflow UI + REST API: {cluster.api_url}   (users and passwords: "
              f"{cluster.airflow_home}/simple_auth_manager_passwords.json.generated)")  # fmt: skip
        print(f"MLflow:                {cluster.mlflow_url}")
        print(f'Logs: {cluster.logs}. For the trainyard and airflow commands: eval "$(make -s cluster-env)"')
    elif args.command == "down":
        cluster.down()
    elif args.command == "status":
        print(json.dumps(cluster.status(), indent=2))
    else:
        for key, value in cluster.env().items():
            print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
