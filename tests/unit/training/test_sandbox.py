"""The custom-command sandbox (trainyard.training.launchers.sandbox), with real users, real processes and
real ACLs: what a sandboxed process can and cannot reach, two launches at once, a launch that crashed."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from datafiles import prepared_in
from trainyard.training.launchers import sandbox
from trainyard.training.launchers.local import run

# Tries each path given (a directory: lists it), writes each of WRITE; prints {path: outcome} as JSON.
PROBE = textwrap.dedent(
    """
    import json, os, socket, sys
    from pathlib import Path
    out = {}
    reads, writes = ([p for p in arg.split(",") if p] for arg in sys.argv[1:3])
    for p in reads:
        try:
            if p.startswith("tcp:"):  # a service of the host's loopback
                socket.create_connection(("127.0.0.1", int(p[4:])), timeout=5).close()
            else:
                _ = list(Path(p).iterdir()) if Path(p).is_dir() else Path(p).read_bytes()
            out[p] = "read"
        except OSError as err:
            out[p] = type(err).__name__
    for p in writes:
        try:
            Path(p).write_text("x")
            out[p] = "wrote"
        except OSError as err:
            out[p] = type(err).__name__
    print(json.dumps({"outcomes": out, "uid": os.getuid(), "env": sorted(os.environ)}))
    """
)


def probe(box: sandbox.Sandbox, reads: list, writes: list[Path] = ()) -> dict:
    lines: list[str] = []
    argv = [sys.executable, "-c", PROBE, ",".join(map(str, reads)), ",".join(map(str, writes))]
    env = box.env(sandbox.scrubbed_env(os.environ))
    run(box.command(argv), env=env, on_line=lines.append, after_exit=box.stop)
    return json.loads(lines[-1])


def acl_users(path: Path) -> set[int]:
    """The uids with an entry of their own in ``path``'s ACL."""
    out = subprocess.run(
        ["getfacl", "--numeric", "--absolute-names", "--omit-header", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {int(line.split(":")[1]) for line in out.splitlines() if line.startswith("user:") and line.split(":")[1]}


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A TRAINYARD_HOME and AIRFLOW_HOME as careless as they come: every file readable by everyone."""
    home, airflow = tmp_path / "trainyard", tmp_path / "airflow"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.setenv("AIRFLOW_HOME", str(airflow))
    old = os.umask(0o022)
    try:
        files = {
            "key": home / "keys" / "signing_key.pem",
            "airflow_cfg": airflow / "airflow.cfg",
            "mlflow_db": home / "mlflow" / "mlflow.db",
            "data": home / "cache" / "prepared" / "mine" / "train.lmdb",
            "other_data": home / "cache" / "prepared" / "theirs" / "train.lmdb",
            "checkout": home / "cache" / "checkouts" / "theirs" / "c1" / "labels.csv",
            "run_config": home / "runs" / "job" / "run1" / "run_config.json",
            "earlier_try": home / "runs" / "job" / "run1" / "work" / "checkpoints" / "step-10.pt",
            "other_run": home / "runs" / "other" / "run9" / "model.pt",
        }
        for name, path in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
    finally:
        os.umask(old)
    return files


@pytest.mark.sandbox
def test_a_sandboxed_process_reads_its_data_and_writes_its_work_only(state):
    work = state["run_config"].parent / "work"
    data = state["data"].parent
    forbidden = ["key", "airflow_cfg", "mlflow_db", "other_data", "checkout", "run_config", "other_run"]
    with socket.create_server(("127.0.0.1", 0)) as service, sandbox.Sandbox(work, readable=[data]) as box:
        assert box.user is not None
        uid = box.user.uid
        service_port = f"tcp:{service.getsockname()[1]}"  # a local service (a rendezvous store, the API)
        report = probe(
            box,
            reads=[state["data"], state["earlier_try"], *(state[k] for k in forbidden), service_port],
            writes=[work / "model.onnx", work.parent / "usage.json", data / "poisoned"],
        )
    outcomes = report["outcomes"]
    assert outcomes[service_port] in ("ConnectionRefusedError", "OSError")  # its own network namespace
    assert report["uid"] == uid != 0
    assert outcomes[str(state["data"])] == "read"
    assert outcomes[str(state["earlier_try"])] == "read"  # a retry resumes from the earlier try's checkpoint
    assert {k: outcomes[str(state[k])] for k in forbidden} == dict.fromkeys(forbidden, "PermissionError")
    assert outcomes[str(work / "model.onnx")] == "wrote"
    assert outcomes[str(work.parent / "usage.json")] == "PermissionError"
    assert outcomes[str(data / "poisoned")] == "PermissionError"
    assert not [k for k in report["env"] if k.startswith(("AIRFLOW", "TRAINYARD", "MLFLOW"))]
    # left: the work tree is the platform's again, no process of the user is left, no ACL entry either
    assert all(p.lstat().st_uid == os.getuid() for p in [work, *work.rglob("*")])
    assert sandbox.processes_of(uid) == []
    assert uid not in acl_users(data) | acl_users(state["data"]) | acl_users(state["run_config"].parents[2])


CHILD = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from trainyard.training.launchers import limits, sandbox
    work, data, crash = sys.argv[1], sys.argv[2], sys.argv[3] == "crash"
    held = limits.HostLimits(cpus=1, memory_bytes=1 << 30, processes=64)
    box = sandbox.Sandbox(work, readable=[data], host_limits=held).__enter__()
    sleeper = subprocess.Popen(box.command(["sleep", "600"]), env=box.env({"PATH": "/usr/bin:/bin"}))
    deadline = time.monotonic() + 30
    while not sandbox.processes_of(box.user.uid):  # the entry point switches to the user, then execs
        assert sleeper.poll() is None and time.monotonic() < deadline, "the sandboxed sleeper did not start"
    cgroups = [str(d) for d, _ in box.enforcement.cgroup.dirs.values()]
    said = {"user": box.user.name, "uid": box.user.uid, "sleeper": sleeper.pid, "cgroups": cgroups}
    print(json.dumps(said), flush=True)
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # hold the sandbox until the test closes stdin
    box.__exit__(None, None, None)
    """
)


def child(work: Path, data: Path, mode: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(work), str(data), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


@pytest.mark.sandbox
def test_two_launches_at_once_get_users_of_their_own(state):
    """Another process's sandbox holds one user; this one gets another, and neither reads the other's work."""
    mine = state["run_config"].parent / "work"
    theirs = state["other_run"].parent / "work"
    proc, held = child(theirs, state["other_data"].parent, "hold")
    try:
        (theirs / "secret.txt").write_text("theirs")  # as root, closed to others by the umask or the sandbox
        with sandbox.Sandbox(mine, readable=[state["data"].parent]) as box:
            assert box.user is not None and box.user.name != held["user"]
            report = probe(box, reads=[theirs / "secret.txt", state["other_data"]])
        assert set(report["outcomes"].values()) == {"PermissionError"}, report
    finally:
        proc.communicate("")
    assert proc.returncode == 0
    assert sandbox.processes_of(held["uid"]) == []  # leaving killed its sleeper


@pytest.mark.sandbox
def test_a_crashed_launch_is_cleaned_up_by_the_next_one_under_that_user(state):
    """The launching process dies with its sandbox open (SIGKILL): its lock goes with it, its processes die
    with it (bubblewrap dies with its parent, and the PID namespace with bubblewrap), and the next launch
    that takes the same user revokes what it was granted and removes its cgroup."""
    import time

    old_work, old_data = state["run_config"].parent / "work", state["data"].parent
    proc, crashed = child(old_work, old_data, "crash")
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert crashed["uid"] in acl_users(old_data)
    assert crashed["cgroups"] and all(Path(d).is_dir() for d in crashed["cgroups"])
    deadline = time.monotonic() + 30  # the kernel delivers the parent-death signals
    while sandbox.processes_of(crashed["uid"]):
        assert time.monotonic() < deadline, "the crashed launch's processes outlived it"
        time.sleep(0.05)
    with sandbox.Sandbox(state["other_run"].parent / "work", among=[crashed["user"]]) as box:
        assert box.user is not None and box.user.name == crashed["user"]
        assert not any(Path(d).exists() for d in crashed["cgroups"])
        assert crashed["uid"] not in acl_users(old_data)
        assert all(p.lstat().st_uid == os.getuid() for p in [old_work, *old_work.rglob("*")])


LEAVER = textwrap.dedent(
    """
    import os, subprocess, sys
    key, work = sys.argv[1], os.getcwd()
    # a daemon of its own session that keeps the output open, links to what it could not read, a file in /tmp
    subprocess.Popen(["sleep", "600"], start_new_session=True)
    os.symlink(key, os.path.join(work, "model.onnx"))
    os.symlink(os.path.dirname(key), os.path.join(work, "keys"))
    open(os.path.join("/tmp", f"left-by-{os.getuid()}"), "w").close()
    print("done", flush=True)
    """
)


@pytest.mark.sandbox
def test_what_a_command_leaves_running_linked_or_in_tmp_is_dealt_with(state):
    """A daemon that holds the output open does not hold the launch; links into trainyard's state are given
    back without following them; what it left in /tmp is gone."""
    import time

    work = state["run_config"].parent / "work"
    key_before = state["key"].stat()
    started = time.monotonic()
    with sandbox.Sandbox(work, readable=[state["data"].parent]) as box:
        assert box.user is not None
        uid = box.user.uid
        lines: list[str] = []
        argv = box.command([sys.executable, "-c", LEAVER, str(state["key"])])
        run(argv, env=box.env({"PATH": os.environ["PATH"]}), on_line=lines.append, after_exit=box.stop)
        assert lines[-1] == "done"
    assert time.monotonic() - started < 60
    assert sandbox.processes_of(uid) == []
    assert not Path(f"/tmp/left-by-{uid}").exists()
    key_after = state["key"].stat()
    assert (key_after.st_uid, key_after.st_mode) == (key_before.st_uid, key_before.st_mode)
    assert (work / "model.onnx").lstat().st_uid == os.getuid()  # the link itself, not what it points at
    assert state["key"].parent.stat().st_uid == os.getuid()


def test_a_custom_command_is_refused_where_there_is_no_sandbox(monkeypatch, trainyard_home):
    """Not root: a local custom job is refused before any data moves, saying why; on Kubernetes it is not."""
    from trainyard.pipeline import check_worker, validate_spec
    from trainyard.training.launchers.local import LocalLauncher

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    raw = {"recipe": "custom", "custom": {"command": ["python", "train.py"]}}
    spec = validate_spec(raw)  # the spec itself is fine: `trainyard validate` accepts it anywhere
    with pytest.raises(sandbox.SandboxUnavailable, match="does not run as root"):
        check_worker(spec)  # the DAG's first task, on the worker
    with pytest.raises(sandbox.SandboxUnavailable, match="does not run as root"):
        LocalLauncher().plan(spec, prepared_in("/d"), run_dir=str(trainyard_home / "r"), config_path="c.json")
    check_worker(validate_spec({**raw, "backends": {"launcher": "kubernetes"}}))


def test_the_environment_keeps_no_setting_or_secret():
    env = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0",
        "AIRFLOW__CORE__FERNET_KEY": "k",
        "AIRFLOW__API_AUTH__JWT_SECRET": "s",
        "TRAINYARD_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----",
        "TRAINYARD_HOME": "/srv/trainyard",
        "MLFLOW_TRACKING_URI": "sqlite:///x",
        "AWS_SECRET_ACCESS_KEY": "a",
        "LAKEFS_SECRET_ACCESS_KEY": "l",
    }
    assert sandbox.scrubbed_env(env) == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0",
    }


def test_the_platform_reads_no_link_the_program_left(tmp_path):
    """model.onnx (or the metrics file) as a link to a file the program could not read is refused, not
    followed with the platform's rights; so is external ONNX data outside the work directory."""
    import onnx
    from onnx import TensorProto, helper

    from trainyard.errors import PermanentError
    from trainyard.training import custom

    work = Path(custom.work_dir(str(tmp_path)))
    work.mkdir()
    (work / "model.onnx").symlink_to("/etc/shadow")
    with pytest.raises(PermanentError, match="not a regular file"):
        custom.output_file(tmp_path, "model.onnx")
    (work / "model.onnx").unlink()
    assert custom.output_file(tmp_path, "model.onnx") is None

    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    weight.data_location = TensorProto.EXTERNAL
    del weight.float_data[:]
    weight.external_data.add(key="location", value="../../keys/signing_key.pem")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph), str(work / "model.onnx"))
    with pytest.raises(PermanentError, match="external data must be a file beside model.onnx"):
        custom.check_external_data(work / "model.onnx")


# What a process holds: fd 0's target and every descriptor above stderr (the listing's own excepted).
FDS = textwrap.dedent(
    """
    import json, os
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor, closed by now
    print(json.dumps(fds))
    """
)


def _fds(lines: list[str]) -> dict[int, str]:
    return {int(k): v for k, v in json.loads(lines[-1]).items()}


@pytest.mark.sandbox
def test_the_sandbox_entry_keeps_no_descriptor_it_was_handed(state):
    """The root entry itself (not only the launcher) puts /dev/null on stdin and closes what is above
    stderr: here it is handed a socket on stdin, as a task's supervisor does, and another socket besides."""
    parent_end, child_end = socket.socketpair()
    extra_a, extra_b = socket.socketpair()
    with parent_end, child_end, extra_a, extra_b, sandbox.Sandbox(state["run_config"].parent / "work") as box:
        argv = box.command([sys.executable, "-c", FDS])
        done = subprocess.run(
            argv,
            stdin=child_end.fileno(),
            pass_fds=[extra_b.fileno()],
            env=box.env({"PATH": os.environ["PATH"]}),
            capture_output=True,
            text=True,
            check=True,
        )
        box.stop()
    fds = _fds(done.stdout.splitlines())
    assert fds[0] == "/dev/null"
    assert set(fds) == {0, 1, 2}, fds
    assert not any(target.startswith("socket:") for target in fds.values()), fds


def test_the_launcher_gives_its_workers_no_stdin_and_no_other_descriptor(tmp_path):
    """``run`` from a process whose stdin is a socket (a task under Airflow's supervisor) holding another
    descriptor: the child has /dev/null on stdin and nothing above stderr."""
    parent_end, child_end = socket.socketpair()
    launcher = textwrap.dedent(
        f"""
        import os, sys
        from trainyard.training.launchers.local import run
        held = os.open({str(tmp_path)!r}, os.O_RDONLY)  # a descriptor this process holds, inheritable
        os.set_inheritable(held, True)
        run([sys.executable, "-c", {FDS!r}], on_line=print)
        """
    )
    with parent_end, child_end:
        done = subprocess.run(
            [sys.executable, "-c", launcher], stdin=child_end.fileno(), capture_output=True, text=True, check=True
        )
    fds = _fds(done.stdout.splitlines())
    assert fds[0] == "/dev/null" and set(fds) == {0, 1, 2}, fds
    assert fds[1].startswith("pipe:") and fds[2] == fds[1]  # the launcher reads both from one pipe
