"""The cluster profile's settings, without starting it (tests/integration/test_cluster_profile.py starts it):
every address is loopback, no password is on a command line that `ps` shows, Celery's redelivery bound
outlasts the longest training a JobSpec may ask for, and its secrets file is its owner's only."""

import stat
from pathlib import Path
from urllib.parse import urlsplit

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


def test_no_password_is_on_a_command_line(tmp_path, monkeypatch):
    cluster = cluster_profile.Cluster(tmp_path)
    started: list[tuple[str, list[str], dict]] = []
    monkeypatch.setattr(cluster, "_spawn", lambda name, argv, env=None: started.append((name, argv, env or {})))
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
    when PostgreSQL restarts), and a SIGTERM to it, as ``down`` sends, stops the service for good."""
    import signal
    import subprocess
    import sys
    import time

    starts = tmp_path / "starts"
    child = f"open({str(starts)!r}, 'a').write('x'); import time; time.sleep(0.3); raise SystemExit(1)"
    script = str(checkout.REPO / "scripts" / "cluster.py")
    proc = subprocess.Popen(
        [sys.executable, script, "supervise", "flaky", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline and len(starts.read_text() if starts.exists() else "") < 2:
        time.sleep(0.1)
    assert len(starts.read_text()) >= 2  # exited once, started again
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "[cluster] flaky exited with 1; starting it again in 1 s" in out
    count = len(starts.read_text())
    time.sleep(1.5)
    assert len(starts.read_text()) == count  # not started again after the SIGTERM

    forever = subprocess.Popen(
        [sys.executable, script, "supervise", "steady", "--", sys.executable, "-c", "import time; time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    forever.send_signal(signal.SIGTERM)
    assert forever.wait(timeout=30) == 128 + signal.SIGTERM  # the service's own end, passed on
