"""The cluster profile's settings, without starting it (tests/integration/test_cluster_profile.py starts it):
every address is loopback, no password is on a command line that `ps` shows, Celery's redelivery bound
outlasts the longest training a JobSpec may ask for, and its secrets file is its owner's only."""

import os
import shutil
import stat
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import checkout
from trainyard.spec import MAX_HOURS_LIMIT

REPO = Path(__file__).resolve().parents[2]
cluster_profile = checkout.cluster_profile()


def test_every_address_is_loopback_and_celery_outlasts_the_longest_training(tmp_path):
    cluster = cluster_profile.Cluster(tmp_path)
    env = cluster.env()
    urls = [v for k, v in env.items() if "://" in v]
    assert urls and all(urlsplit(u.removeprefix("db+")).hostname == "127.0.0.1" for u in urls), urls
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert int(env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"]) > MAX_HOURS_LIMIT * 3600
    assert (env["AIRFLOW__TRAINYARD__TRAINING_QUEUE"], env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"]) == ("gpu", "cpu")
    assert stat.S_IMODE((tmp_path / "secrets.json").stat().st_mode) == 0o600
    # the passwords are the profile's own, and the same at every call
    assert (
        cluster.secret("postgres") != cluster.secret("redis")
        and cluster.secret("redis") in env["AIRFLOW__CELERY__BROKER_URL"]
    )
    assert cluster_profile.Cluster(tmp_path).secret("postgres") == cluster.secret("postgres")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="hosts of their own need root and ip")
def test_hosts_of_their_own_put_every_address_on_the_bridge_and_are_kept_for_the_next_commands(tmp_path):
    """`up --hosts 2`: two GPU hosts in network namespaces, every service on the bridge's address (which the
    namespaces reach), and the choice kept in the folder for `down`, `status` and `env`; `--hosts 0` again
    goes back to loopback."""
    two = cluster_profile.in_folder(tmp_path, 2)
    assert [n for n, w in two.workers.items() if w.own_host] == ["gpu-host-1", "gpu-host-2"]
    urls = [v for v in two.env().values() if "://" in v]
    assert {urlsplit(u.removeprefix("db+")).hostname for u in urls} == {two.network.address}
    assert cluster_profile.in_folder(tmp_path).network == two.network  # a later command without --hosts
    assert cluster_profile.in_folder(tmp_path, 0).network is None
    assert cluster_profile.in_folder(tmp_path).network is None


def test_no_password_is_on_a_command_line(tmp_path, monkeypatch):
    cluster = cluster_profile.Cluster(tmp_path)
    started: list[tuple[str, list[str], dict]] = []
    monkeypatch.setattr(
        cluster, "_spawn", lambda name, argv, env=None, namespace="": started.append((name, argv, env or {}))
    )
    monkeypatch.setattr(cluster_profile, "_wait_port", lambda *args: None)
    monkeypatch.setattr(cluster_profile.shutil, "which", lambda name: f"/usr/bin/{name}")
    cluster.start_redis()
    cluster.start_mlflow()
    cluster.start_airflow()
    secrets = [cluster.secret("postgres"), cluster.secret("redis")]
    assert {name for name, _, _ in started} >= {"redis", "mlflow", "api-server", "triggerer", "worker-gpu"}
    for name, argv, _ in started:
        assert not any(s in arg for s in secrets for arg in argv), (name, argv)
    redis_conf = (tmp_path / "redis" / "redis.conf").read_text()
    assert "bind 127.0.0.1" in redis_conf and f"requirepass {secrets[1]}" in redis_conf
    assert stat.S_IMODE((tmp_path / "redis" / "redis.conf").stat().st_mode) == 0o600
    (mlflow_argv, mlflow_env) = next((argv, env) for name, argv, env in started if name == "mlflow")
    assert mlflow_argv[mlflow_argv.index("--host") + 1] == "127.0.0.1"
    assert secrets[0] in mlflow_env["MLFLOW_BACKEND_STORE_URI"]
    triggerer = next(argv for name, argv, _ in started if name == "triggerer")
    assert "--skip-serve-logs" in triggerer  # its log server would listen on every interface


def test_a_service_that_exits_is_started_again_and_sigterm_ends_both(tmp_path):
    """``cluster.py supervise`` keeps a service up, as Kubernetes or systemd would (Airflow's scheduler exits
    when PostgreSQL restarts), gives up on one that keeps exiting at once, and a SIGTERM to it, as ``down``
    sends, stops the service for good."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    script = str(checkout.REPO / "scripts" / "cluster.py")

    def supervised(name: str, code: str) -> subprocess.Popen:
        argv = [sys.executable, script, "supervise", name, "--", sys.executable, "-c", code]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)

    def started(path, times: int) -> None:
        deadline = time.time() + 60
        while time.time() < deadline and len(path.read_text() if path.exists() else "") < times:
            time.sleep(0.05)
        assert len(path.read_text()) >= times

    starts, ready = tmp_path / "starts", tmp_path / "ready"
    flaky = supervised("flaky", f"open({str(starts)!r}, 'a').write('x'); import time; time.sleep(0.3); exit(1)")
    steady = supervised("steady", f"open({str(ready)!r}, 'a').write('x'); import time; time.sleep(600)")
    try:
        started(starts, 2)  # exited once, started again
        flaky.send_signal(signal.SIGTERM)
        out, _ = flaky.communicate(timeout=30)
        assert "[cluster] flaky exited with 1; starting it again in 1 s" in out
        count = len(starts.read_text())
        time.sleep(1.5)
        assert len(starts.read_text()) == count  # not started again after the SIGTERM

        started(ready, 1)  # the supervisor passes signals on from before it starts its service
        steady.send_signal(signal.SIGTERM)
        assert steady.wait(timeout=30) == 128 + signal.SIGTERM  # the service's own end, passed on
    finally:
        for proc in (flaky, steady):  # the supervisor and its service, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)


def test_a_service_that_keeps_exiting_at_once_is_given_up(tmp_path, monkeypatch):
    cluster_profile = checkout.cluster_profile()
    monkeypatch.setattr(cluster_profile, "RESTART_DELAYS_S", (0.01, 0.01))
    import signal
    import sys

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:  # it runs here, in pytest's process: its signal handlers are put back after
        assert cluster_profile.supervise("broken", [sys.executable, "-c", "exit(3)"]) == 3
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _has_user(name: str) -> bool:
    import pwd

    try:
        return bool(pwd.getpwnam(name))
    except KeyError:
        return False


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setfacl") is None or not _has_user("postgres"),
    reason="needs root, setfacl and PostgreSQL's postgres user",
)
def test_postgres_can_reach_its_data_inside_a_home_closed_to_others(tmp_path):
    # the default place, var/cluster, is inside TRAINYARD_HOME, which `make setup` closes to other users
    home = tmp_path / "var"
    home.mkdir(mode=0o750)
    home.chmod(0o750)
    cluster = cluster_profile.Cluster(home / "cluster")

    def postgres_reaches(path: Path) -> bool:
        return subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(path)], check=False).returncode == 0

    (home / "cluster").mkdir()
    assert not postgres_reaches(home / "cluster")
    cluster._let_postgres_in()
    assert postgres_reaches(home / "cluster")
    assert stat.S_IMODE(home.stat().st_mode) == 0o750  # the mode (and so the ACL's mask) as it was
    nobody = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-x", str(home)], check=False)
    assert nobody.returncode != 0


def test_a_running_service_is_known_by_its_start_whatever_the_system_clock_does(tmp_path, monkeypatch):
    """A service's pid file names its process by the boot and the clock ticks to its start: a system clock
    set forward (an NTP step, which moves psutil's wall-clock start of every process) leaves it running,
    and another process given its pid is not taken for it."""
    import psutil

    cluster = cluster_profile.Cluster(tmp_path)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        cluster.pids.mkdir(parents=True)
        (cluster.pids / "redis.pid").write_text(f"{proc.pid} {cluster_profile.process_start(proc.pid)}")
        assert cluster.pid("redis") == proc.pid
        booted = psutil.boot_time()
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + 30)  # the clock moved 30 s
        assert cluster.pid("redis") == proc.pid
        (cluster.pids / "redis.pid").write_text(f"{os.getpid()} {cluster_profile.process_start(proc.pid)}")
        assert cluster.pid("redis") is None  # this pid's process is another
        monkeypatch.undo()
        (cluster.pids / "redis.pid").write_text(f"{proc.pid} {psutil.Process(proc.pid).create_time()}")
        assert cluster.pid("redis") == proc.pid  # a pid file an earlier trainyard wrote: its service is found
    finally:
        proc.kill()
        proc.wait()
    (cluster.pids / "redis.pid").write_text(f"{proc.pid} {cluster_profile.process_start(os.getpid())}")
    assert cluster.pid("redis") is None  # gone
