"""The local sandbox a custom command runs in: an unprivileged OS user of its own, a scrubbed environment,
read access to its run's prepared data and write access to its run's ``work`` directory, nothing else of
trainyard's.

**Who.** ``trainyard sandbox setup`` (``scripts/setup.sh``, as root) creates :data:`USERS` system users,
``trainyard-run0`` ... ``trainyard-run15``, each with its own group and no home or login shell. A launch
takes one that no other launch holds (an exclusive ``flock`` on ``$TRAINYARD_HOME/sandbox/<user>.lock``,
released by the kernel when the launching process dies), so two runs never share a user and cannot read
each other's files. A busy fleet of sandboxes is a retryable error: the task tries again later.

**What it can reach.** trainyard's state is private to the Airflow user: ``$TRAINYARD_HOME`` and
``$AIRFLOW_HOME`` are closed to others (``chmod o-rwx``, at set-up and again at each launch; the Airflow
processes and the CLI create files with umask 077, see :func:`private_umask`). A launch opens exactly one
path in: POSIX ACL entries for its user only (``setfacl``): search (``x``) on the directories that lead to
the run's data and run directory, to the Python environment and to the ``trainyard`` package, read on the
prepared data, and ownership of the run's ``work`` directory. Every directory it opens for search has its
other entries closed to others, so the way in leads nowhere else. So the signing keys, the Airflow config
and database, MLflow's store, the dataset store and every other run's and team's files give the command
``Permission denied``.

**Crash safety.** What a launch grants is written to ``$TRAINYARD_HOME/sandbox/<user>.json`` before it is
granted. Leaving the sandbox (or, after a crash, the next launch that takes the same user) kills every
process left under that user, revokes what the record lists and gives the ``work`` tree back to the
Airflow user; only then is the lock released.

Where the sandbox cannot be had (not root, no sandbox users, no ``setfacl``) :func:`require` refuses the
custom command and says why; nothing runs unsandboxed. On Kubernetes a custom command runs in its team's
namespace with the team's service account instead (:mod:`~trainyard.training.launchers.kubernetes`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainyard import paths
from trainyard.errors import PermanentError, RetryableError

USER_PREFIX = "trainyard-run"
USERS = 16  # custom commands that can run at once on one worker host
PRIVATE_UMASK = 0o077
# What a custom command's environment keeps of the worker's (the rest, Airflow's and trainyard's settings
# and any secret in them, is dropped); the launcher adds the platform's TRAINYARD_* and rendezvous variables.
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
KEPT_ENV_PREFIXES = ("NCCL_",)


class SandboxUnavailable(PermanentError):
    """A custom command cannot run here, because the sandbox it must run in cannot be had."""


class SandboxBusy(RetryableError):
    """Every sandbox user is taken by a running custom command; a later try gets one."""


@dataclass(frozen=True)
class SandboxUser:
    name: str
    uid: int
    gid: int


def users() -> list[SandboxUser]:
    """The sandbox users set-up created on this host, in order."""
    found = []
    for i in range(USERS):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(f"{USER_PREFIX}{i}")
            found.append(SandboxUser(entry.pw_name, entry.pw_uid, entry.pw_gid))
    return found


def unavailable_reason() -> str | None:
    """Why this host cannot sandbox a custom command, or None if it can."""
    if os.geteuid() != 0:
        return (
            "the worker does not run as root, so it cannot switch to an unprivileged sandbox user "
            "(run the Airflow worker as root, or send custom jobs to Kubernetes: backends.launcher 'kubernetes')"
        )
    if not users():
        return f"no sandbox users ({USER_PREFIX}0...) on this host: run `trainyard sandbox setup` as root"
    if shutil.which("setfacl") is None:
        return "setfacl is missing (Debian: apt-get install acl), so the run's files cannot be opened to it alone"
    return None


def require() -> None:
    """SandboxUnavailable, saying why, if a custom command cannot be sandboxed on this host."""
    reason = unavailable_reason()
    if reason:
        raise SandboxUnavailable(
            f"recipe 'custom': a custom command runs locally only as an unprivileged sandbox user, and this "
            f"host has no sandbox: {reason}"
        )


def private_umask() -> None:
    """Files trainyard and Airflow create from now on in this process (and its children) are its user's
    alone, so a sandboxed command cannot read them even where it may search a directory."""
    os.umask(PRIVATE_UMASK)


def scrubbed_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a sandboxed command keeps of ``env``: :data:`KEPT_ENV` and :data:`KEPT_ENV_PREFIXES` only."""
    return {k: v for k, v in env.items() if k in KEPT_ENV or k.startswith(KEPT_ENV_PREFIXES)}


def protected_paths() -> list[Path]:
    """The state a sandboxed command must never read: trainyard's home and Airflow's (config, database,
    logs), whatever their place."""
    out = [paths.home()]
    if os.environ.get("AIRFLOW_HOME"):
        out.append(Path(os.environ["AIRFLOW_HOME"]).resolve())
    return out


def close_to_others(path: Path) -> None:
    """``chmod o-rwx`` on ``path`` if it exists (not on what is below it)."""
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IRWXO:
            path.chmod(stat.S_IMODE(st.st_mode) & ~stat.S_IRWXO)


# -- set-up ------------------------------------------------------------------------------------------------
def setup() -> list[str]:
    """Create the sandbox users that are missing and close trainyard's and Airflow's state to others
    (idempotent; root only). Returns what it did, one line each."""
    if os.geteuid() != 0:
        raise PermanentError("trainyard sandbox setup: run it as root (it creates system users)")
    done = []
    existing = {u.name for u in users()}
    for i in range(USERS):
        name = f"{USER_PREFIX}{i}"
        if name in existing:
            continue
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", "--comment", "trainyard sandbox for custom commands", name],
            check=True,
        )  # fmt: skip
        done.append(f"created user {name}")
    for path in protected_paths():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        for p in [path, *path.rglob("*")]:
            close_to_others(p)
        done.append(f"closed {path} to other users")
    return done


# -- one launch --------------------------------------------------------------------------------------------
def _setfacl(*args: str) -> None:
    subprocess.run(["setfacl", *args], check=True, capture_output=True, text=True)


def _search_path(target: Path) -> list[Path]:
    """The directories above ``target`` (and ``target`` if it is one) that others may not search."""
    chain = [p for p in [target, *target.parents] if p.is_dir()]
    return [p for p in chain if not p.stat().st_mode & stat.S_IXOTH]


def processes_of(uid: int) -> list[int]:
    """Pids of the live processes (zombies are dead) whose real user is ``uid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            fields = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                pids.append(int(entry.name))
    return pids


def kill_all(uid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` (a sandbox user's: nothing else runs as it), and wait for them."""
    deadline = time.monotonic() + wait_s
    while pids := processes_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of sandbox uid {uid} survive SIGKILL")
        time.sleep(0.05)


def _chown_tree(root: Path, uid: int, gid: int, only_from: int | None = None) -> None:
    """Give ``root`` and what is below it to ``uid``:``gid`` without following links. ``only_from``: only
    entries that user owns. A regular file with other hard links is left alone (it may be someone else's)."""
    if not root.exists():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, ""]:
            p = Path(dirpath, name) if name else Path(dirpath)
            st = p.lstat()
            if only_from is not None and st.st_uid != only_from:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                continue
            os.chown(p, uid, gid, follow_symlinks=False)


class Sandbox:
    """``with Sandbox(work_dir, readable=[data_dir]) as box:`` run ``box.popen_args()`` with ``box.env(...)``.

    ``work_dir`` becomes the sandbox user's for the duration (created if missing); ``readable`` are the
    files or trees it may read; what leads to them it may search."""

    def __init__(
        self, work_dir: str | Path, readable: Iterable[str | Path] = (), among: Iterable[str] | None = None
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.readable = [Path(p).resolve() for p in readable]
        self.among = None if among is None else set(among)  # the sandbox users it may take (default: any)
        self.state_dir = paths.home() / "sandbox"
        self.user: SandboxUser | None = None
        self._lock_fd: int | None = None

    # entering and leaving
    def __enter__(self) -> Sandbox:
        require()
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.user, self._lock_fd = self._take_user()
        try:
            self._clean_up(self.user)  # what a crashed launch under this user left
            self._grant(self.user)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._leave()

    def _leave(self) -> None:
        assert self.user is not None and self._lock_fd is not None
        try:
            self._clean_up(self.user)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _take_user(self) -> tuple[SandboxUser, int]:
        candidates = [u for u in users() if self.among is None or u.name in self.among]
        for user in candidates:
            fd = os.open(self.state_dir / f"{user.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return user, fd
        raise SandboxBusy(f"all {len(candidates)} sandbox users are running custom commands; try again later")

    @contextlib.contextmanager
    def _acl_lock(self) -> Iterator[None]:
        """setfacl reads, changes and writes a file's whole ACL: two launches granting on the same directory
        at once must take turns, or one's entry is lost."""
        fd = os.open(self.state_dir / "acl.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _record_path(self, user: SandboxUser) -> Path:
        return self.state_dir / f"{user.name}.json"

    def _grant(self, user: SandboxUser) -> None:
        protected = protected_paths()
        for path in protected:
            close_to_others(path)
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        package = Path(__file__).resolve().parents[3]  # the directory trainyard is imported from
        # The interpreter may live in another tree than the venv (pyenv under /root): both are searched.
        targets = [*self.readable, self.work_dir.parent, Path(sys.prefix), Path(sys.base_prefix), package]
        targets = [t.resolve() for t in targets]
        # Inside trainyard's and Airflow's state, every entry beside the way in is closed to others first
        # (the umask keeps new ones closed), so searching a directory on the way leads nowhere else.
        for target in targets:
            for d in [target, *target.parents]:
                if d.is_dir() and any(d == p or p in d.parents for p in protected):
                    for entry in d.iterdir():
                        close_to_others(entry)
        searched = list(dict.fromkeys(d for t in targets for d in _search_path(t if t.is_dir() else t.parent)))
        record = {
            "search": [str(d) for d in searched],
            "read": [str(p) for p in self.readable],
            "work": str(self.work_dir),
        }
        tmp = self._record_path(user).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._record_path(user))  # recorded before granted: a crash leaves nothing unrevoked
        _chown_tree(self.work_dir, user.uid, user.gid)
        with self._acl_lock():
            for d in searched:
                _setfacl("-m", f"u:{user.uid}:x", str(d))
            for p in self.readable:
                _setfacl("-R", "-P", "-m", f"u:{user.uid}:rX", str(p))

    def _clean_up(self, user: SandboxUser) -> None:
        kill_all(user.uid)
        record_path = self._record_path(user)
        if not record_path.exists():
            return
        record = json.loads(record_path.read_text())
        with self._acl_lock():
            for p in record.get("read", []):
                if Path(p).exists():
                    _setfacl("-R", "-P", "-x", f"u:{user.uid}", p)
            for d in record.get("search", []):
                if Path(d).exists():
                    _setfacl("-x", f"u:{user.uid}", d)
        if record.get("work"):
            _chown_tree(Path(record["work"]), os.getuid(), os.getgid(), only_from=user.uid)
        record_path.unlink()

    # what the launch uses
    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` for the sandboxed command, with HOME (and caches) in its work directory."""
        return {**base, "HOME": str(self.work_dir)}

    def popen_args(self) -> dict:
        """subprocess.Popen arguments that start the command as the sandbox user, with no other groups and
        a private umask."""
        assert self.user is not None
        return {"user": self.user.uid, "group": self.user.gid, "extra_groups": [], "umask": PRIVATE_UMASK}
