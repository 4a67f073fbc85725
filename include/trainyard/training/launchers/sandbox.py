"""The local sandbox a training's workers run in (a custom command, and a built-in trainer's workers
wherever the host has it): an unprivileged OS user of its own, namespaces of its own (no network but
loopback, a private ``/dev/shm``), a scrubbed environment, read access to its run's prepared data (and
run config, and a recipe's input files) and write access to its run's ``work`` directory, nothing else
of trainyard's. Their metrics reach MLflow through a file the launching task relays
(:mod:`trainyard.training.metrics`), so the workers never touch MLflow's store.

**Who.** ``trainyard sandbox setup`` (``scripts/setup.sh``, as root) creates :data:`USERS` system users,
``trainyard-run0`` ... ``trainyard-run63``, each with its own group and no home or login shell. A launch
takes one that no other launch on this host holds (an exclusive ``flock`` in :data:`STATE_DIR`, released by
the kernel when the launching process dies), so two runs never share a user and cannot read each other's
files. A launch waits a while for a free user; a fleet of sandboxes that stays busy is a retryable error.

**How it starts.** The launcher runs :mod:`~trainyard.training.launchers.sandbox_entry` (``python -I -S``)
with the launch's cgroup, the user, the work directory and the command, as root: it moves itself into the
cgroup (the job's CPU, memory and process limits, :mod:`~trainyard.training.launchers.limits`), then
bubblewrap gives it a PID namespace with its own ``/proc`` (the job sees no other process on the host), a
network namespace (loopback only, so no local service, another job's rendezvous store or the Airflow API
is reachable, and no outside network either), a mount namespace (a fresh ``/dev/shm``) and SysV IPC of its
own, with ``no_new_privs``; it drops every group and switches to the sandbox user, then execs the command
(torchrun or horovodrun and their workers: trainyard's or the user's program).

**What it can reach.** trainyard's state is not for others: ``$TRAINYARD_HOME`` and ``$AIRFLOW_HOME`` are
closed to others (``chmod o-rwx``, at set-up and again at each launch; the Airflow processes and the CLI
create files with umask 007, :func:`private_umask`: group kept for the Kubernetes pods, which share group 0
with the Airflow user, never the sandbox users). A launch opens exactly one way in: POSIX ACL entries for
its user only (``setfacl``): search (``x``) on the directories that lead to the run's data and run
directory, to the Python environment and to the ``trainyard`` package, read on what the launcher names
(the prepared data; a built-in trainer's run config and a recipe's input files), and ownership of the
run's ``work`` directory. Inside trainyard's and Airflow's state every directory on the
way has its other entries closed to others, so the way in leads nowhere else: the signing keys, the
Airflow config and database, MLflow's store, the dataset store and every other run's and team's files give
the command ``Permission denied``. Directories outside that state that others may not search (a Python
under ``/root``) become searchable for the user, not readable: see :func:`private_dirs_opened`.

**Crash safety.** What a launch grants is written to ``STATE_DIR/<user>.json`` before it is granted.
Leaving the sandbox kills every process left under the user (``kill -1`` as that user), removes the
launch's cgroup (named after the user), revokes what the record lists, deletes what it left in ``/tmp``
and gives the ``work`` tree back to the Airflow user (a walk by directory descriptors that follows no
link); only then is the lock released. A launch that died with its
sandbox open is cleaned up the same way by the next launch on the host that finds its user unlocked.

Where the sandbox cannot be had (not root, no sandbox users, no ``setfacl``, no ACL support, no
bubblewrap or no namespaces)
:func:`require` refuses a custom command and says why; no custom command runs unsandboxed. A built-in
trainer's workers then run as the task's own user (trainyard's code on the run's data; the log says so).
On Kubernetes the workers run in their team's namespace with the team's service account instead
(:mod:`~trainyard.training.launchers.kubernetes`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainyard import paths
from trainyard.errors import PermanentError, RetryableError
from trainyard.files import atomic_write, file_lock
from trainyard.training.launchers import limits, sandbox_entry
from trainyard.training.launchers.sandbox_entry import USER_PREFIX, USERS

STATE_DIR = Path("/var/lib/trainyard-sandbox")  # host-wide: locks and grant records of every launch here
PRIVATE_UMASK = 0o007
BUSY_WAIT_S = 900.0  # the longest a launch waits for a free sandbox user
# RLIMIT_NPROC of a sandbox user whose launch has no process limit of its own (the sandbox's own tests) or
# whose processes no cgroup counts: a fork bomb stops there
PROCESS_LIMIT = 4096
# What a custom command's environment keeps of the worker's (the rest, Airflow's and trainyard's settings
# and any secret in them, is dropped); the launcher adds the platform's TRAINYARD_* and rendezvous variables.
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
KEPT_ENV_PREFIXES = ("NCCL_",)
# What a built-in trainer's workers keep besides: trainyard's code and home (a recipe's input files are
# found there), the fault-injection hook of the resume tests, and the libraries' own tuning variables.
BUILT_IN_ENV: tuple[str, ...] = ("HOME", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD")
BUILT_IN_ENV += ("TRAINYARD_HOME", "TRAINYARD_FAIL_ONCE_AT_STEP")
BUILT_IN_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "GLOO_", "TORCH", "TRITON_", "HOROVOD_", "DS_", "CUDA_", "PYTORCH_")
SYSTEM_DIRS = {Path(p) for p in ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/opt", "/proc", "/root")}
SYSTEM_DIRS |= {Path(p) for p in ("/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib")}


class SandboxUnavailable(PermanentError):
    """A custom command cannot run here, because the sandbox it must run in cannot be had."""


class SandboxBusy(RetryableError):
    """Every sandbox user is taken by a running training; a later try gets one."""


class SandboxError(RetryableError):
    """Setting up or tearing down a sandbox failed (the message says which step, and the tool's error)."""


@dataclass(frozen=True)
class SandboxUser:
    name: str
    uid: int
    gid: int


def user_numbers() -> range:
    """The sandbox users launches from this installation take (and clean up after): all :data:`USERS`, or
    ``TRAINYARD_SANDBOX_USERS=FIRST-LAST`` (two installations sharing a host, such as a test suite beside
    a worker, each keep to their own users and never clean up the other's)."""
    given = os.environ.get("TRAINYARD_SANDBOX_USERS", "")
    if not given:
        return range(USERS)
    found = re.fullmatch(r"([0-9]+)-([0-9]+)", given)
    if not found or not int(found[1]) <= int(found[2]) < USERS:
        raise PermanentError(
            f"TRAINYARD_SANDBOX_USERS={given!r}: expected FIRST-LAST with 0 <= FIRST <= LAST < {USERS}"
        )
    return range(int(found[1]), int(found[2]) + 1)


def users(numbers: Iterable[int] | None = None) -> list[SandboxUser]:
    """The sandbox users set-up created on this host, in order: those of :func:`user_numbers`, or of
    ``numbers``."""
    found = []
    for i in user_numbers() if numbers is None else numbers:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(f"{USER_PREFIX}{i}")
            found.append(SandboxUser(entry.pw_name, entry.pw_uid, entry.pw_gid))
    return found


def unavailable_reason() -> str | None:
    """Why this host cannot sandbox a training's workers, or None if it can."""
    if os.geteuid() != 0:
        return (
            "the worker does not run as root, so it cannot switch to an unprivileged sandbox user "
            "(run the Airflow worker as root, or train on Kubernetes: backends.launcher 'kubernetes')"
        )
    found = users()
    if not found:
        return f"no sandbox users ({USER_PREFIX}0...) on this host: run `trainyard sandbox setup` as root"
    if shutil.which("setfacl") is None:
        return "setfacl is missing (Debian: apt-get install acl), so the run's files cannot be opened to it alone"
    if shutil.which("bwrap", path=sandbox_entry.SYSTEM_PATH) is None:
        return "bubblewrap is missing (Debian: apt-get install bubblewrap), which gives a job its own namespaces"
    if _ready:
        return None
    try:
        STATE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        _setfacl("-m", f"u:{found[0].uid}:---", str(STATE_DIR))
        _setfacl("-x", f"u:{found[0].uid}", str(STATE_DIR))
    except (OSError, SandboxError) as err:
        return f"the filesystem of {STATE_DIR} takes no POSIX ACL ({err})"
    done = subprocess.run([*entry_argv(), "--probe"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"this host does not let bubblewrap create PID, network and mount namespaces (CAP_SYS_ADMIN): {why}"
    _ready.append(True)  # users, ACLs and namespaces do not go away: this process need not ask again
    return None


_ready: list[bool] = []


def require() -> None:
    """SandboxUnavailable, saying why, if a custom command cannot be sandboxed on this host."""
    reason = unavailable_reason()
    if reason:
        raise SandboxUnavailable(
            f"recipe 'custom': a custom command runs locally only as an unprivileged sandbox user, and this "
            f"host has no sandbox: {reason}"
        )


def private_umask() -> None:
    """Files trainyard and Airflow create from now on in this process (and its children) are for their
    user and group only, so a sandboxed command cannot read them even where it may search a directory."""
    os.umask(PRIVATE_UMASK)


def scrubbed_env(env: Mapping[str, str], built_in: bool = False) -> dict[str, str]:
    """What a worker keeps of ``env``: :data:`KEPT_ENV` and :data:`KEPT_ENV_PREFIXES` only, and with
    ``built_in`` (a built-in trainer's workers) :data:`BUILT_IN_ENV` and :data:`BUILT_IN_ENV_PREFIXES`."""
    names = KEPT_ENV + BUILT_IN_ENV if built_in else KEPT_ENV
    prefixes = KEPT_ENV_PREFIXES + BUILT_IN_ENV_PREFIXES if built_in else KEPT_ENV_PREFIXES
    return {k: v for k, v in env.items() if k in names or k.startswith(prefixes)}


def protected_paths() -> list[Path]:
    """The state a sandboxed command must never read: trainyard's home and Airflow's (config, database,
    logs), whatever their place."""
    airflow = Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser()
    return [paths.home(), airflow.resolve()]


def close_to_others(path: Path) -> None:
    """``chmod o-rwx`` on ``path`` if it exists (not on what is below it; a link is left alone)."""
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IRWXO:
            path.chmod(stat.S_IMODE(st.st_mode) & ~stat.S_IRWXO)


PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory trainyard is imported from
ENTRY = str(Path(sandbox_entry.__file__).resolve())  # run by path: only it and the standard library run as root


def _code_dirs() -> list[Path]:
    """What a sandboxed command runs from: the venv, the interpreter's own tree (pyenv keeps it apart, under
    /root) and trainyard's package root."""
    return [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), PACKAGE_ROOT]


def private_dirs_opened() -> list[Path]:
    """Directories outside trainyard's state that others may not search and a launch makes searchable for
    its user (a Python installed under ``/root``): what is world-readable in them becomes readable by name."""
    searched = dict.fromkeys(d for t in _code_dirs() for d in _search_path(t))
    return [d for d in searched if not _inside(d, protected_paths())]


# -- set-up ------------------------------------------------------------------------------------------------
def setup() -> list[str]:
    """Create the sandbox users that are missing and close trainyard's and Airflow's state to others
    (idempotent; root only; TRAINYARD_HOME and AIRFLOW_HOME must be set, and may not be system directories).
    Returns what it did, one line each."""
    if os.geteuid() != 0:
        raise PermanentError("trainyard sandbox setup: run it as root (it creates system users)")
    missing = [name for name in ("TRAINYARD_HOME", "AIRFLOW_HOME") if not os.environ.get(name)]
    if missing:
        raise PermanentError(
            f"trainyard sandbox setup: set {' and '.join(missing)} (sudo drops the environment: `sudo -E`), "
            "so that it closes the right directories"
        )
    protected = protected_paths()
    system = [str(p) for p in protected if p in SYSTEM_DIRS]
    if system:
        raise PermanentError(f"trainyard sandbox setup: refusing to close system directories {system} to others")
    done = []
    existing = {u.name for u in users(range(USERS))}
    for i in range(USERS):
        name = f"{USER_PREFIX}{i}"
        if name in existing:
            continue
        subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", "--comment", "trainyard sandbox for training workers", name],
            check=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        done.append(f"created user {name}")
    STATE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in protected:
        path.mkdir(parents=True, exist_ok=True, mode=0o770)
        for p in [path, *path.rglob("*")]:
            close_to_others(p)
        done.append(f"closed {path} to other users")
    done += [f"note: {d} is searchable by the sandbox users (the Python lives below it)" for d in private_dirs_opened()]
    return done


# -- the pieces of a launch --------------------------------------------------------------------------------
def _setfacl(*args: str) -> None:
    done = subprocess.run(["setfacl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxError(f"setfacl {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


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


def _kill_every_process_of(user: SandboxUser) -> None:
    """``kill(-1, SIGKILL)`` as ``user``: every process of the user at once, also those forked meanwhile.

    From a forked child that becomes the user and signals, without an exec: no program runs that a daemon
    left behind could have swapped in, and the child's ``/proc`` entries (its environment, which is the
    task's, and its memory) stay root's, as changing its ids leaves it non-dumpable. The child does little
    beyond those system calls (no import, no lock of this process's), and it is waited for with a deadline:
    a process of the user could stop it (SIGSTOP) once it is the user, and would only delay the next try."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)
            os.kill(-1, signal.SIGKILL)  # Linux: every process the caller may signal, but not itself
            status = 0
        finally:
            os._exit(status)
    deadline = time.monotonic() + 5.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # as root: the helper itself, stopped or stuck
            os.waitpid(pid, 0)
            return
        time.sleep(0.01)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SandboxError(f"could not become sandbox user {user.name} to stop its processes")


def kill_all(user: SandboxUser, wait_s: float = 30.0) -> None:
    """SIGKILL every process of ``user`` (nothing else runs as it) and wait until none is left."""
    deadline = time.monotonic() + wait_s
    while processes_of(user.uid):
        _kill_every_process_of(user)
        if time.monotonic() > deadline:
            raise SandboxError(
                f"processes {processes_of(user.uid)} of sandbox user {user.name} survive SIGKILL for {wait_s:.0f} s "
                "(stuck in the kernel, e.g. on a GPU driver call); the task's retry cleans them up"
            )
        time.sleep(0.05)


def _chown_tree(root: Path, uid: int, gid: int, only_from: int | None = None) -> None:
    """Give ``root`` and what is below it to ``uid``:``gid``, walking by directory descriptors and following
    no link (a link swapped in mid-walk cannot redirect it). ``only_from``: only entries that user owns.
    Otherwise a regular file with other hard links is left alone (it may be someone else's)."""
    if not root.is_dir() or root.is_symlink():
        return

    def give(name: str, dir_fd: int) -> None:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if only_from is not None and st.st_uid != only_from:
            return
        if only_from is None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            return
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)

    parent_fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        give(root.name, parent_fd)
    finally:
        os.close(parent_fd)
    for _, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in [*dirnames, *filenames]:
            with contextlib.suppress(FileNotFoundError):
                give(name, dir_fd)


def _remove_owned(uid: int, roots: Iterable[Path] = (Path("/tmp"), Path("/var/tmp"))) -> None:
    """Delete what ``uid`` left at the top of the shared temporary directories (a later run under the same
    user must not find it)."""
    for root in roots:
        with contextlib.suppress(FileNotFoundError):
            for entry in root.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    st = entry.lstat()
                    if st.st_uid != uid:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(entry)  # descriptor-based on Linux: it follows no link
                    else:
                        entry.unlink()


# -- one launch --------------------------------------------------------------------------------------------
class Sandbox:
    """``with Sandbox(work_dir, readable=[data_dir]) as box:`` run ``box.command(argv)`` with
    ``box.env(...)``, and call ``box.stop()`` once the command's own process has ended.

    ``work_dir`` becomes the sandbox user's for the duration (created if missing); ``readable`` are the
    files or trees it may read; what leads to them it may search. ``host_limits``: the job's CPU, memory and
    process limits, held by a cgroup named after the user (:attr:`enforcement` says what holds them);
    without, the user's RLIMIT_NPROC (:data:`PROCESS_LIMIT`) only."""

    def __init__(
        self,
        work_dir: str | Path,
        readable: Iterable[str | Path] = (),
        among: Iterable[str] | None = None,
        host_limits: limits.HostLimits | None = None,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.readable = [Path(p).resolve() for p in readable]
        # the names the command opens them by (a link's own directory must be searchable too)
        self.named = [Path(p).absolute() for p in readable]
        self.among = None if among is None else set(among)  # the sandbox users it may take (default: any)
        self.host_limits = host_limits
        self.enforcement: limits.Enforcement | None = None
        self.user: SandboxUser | None = None
        self._lock_fd: int | None = None

    # entering and leaving
    def __enter__(self) -> Sandbox:
        require()
        self.user, self._lock_fd = self._take_user()
        try:
            self._clean_up(self.user)  # what a crashed launch under this user left
            self._clean_up_unlocked()  # and under any other user no launch holds
            self._grant(self.user)
            if self.host_limits is not None:
                self.enforcement = limits.create(self.user.name, self.host_limits)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._leave()

    def stop(self) -> None:
        """Kill every process the command left (a daemon that would hold its output open, or run on)."""
        assert self.user is not None
        if self._lock_fd is not None:  # never once the user is given back: it may be another launch's then
            kill_all(self.user)

    def _leave(self) -> None:
        assert self.user is not None and self._lock_fd is not None
        try:
            self._clean_up(self.user)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    @staticmethod
    def _lock(user: SandboxUser) -> int | None:
        """The user's lock, held, or None if another launch holds it."""
        fd = os.open(STATE_DIR / f"{user.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _take_user(self) -> tuple[SandboxUser, int]:
        """A free sandbox user, locked; waits up to :data:`BUSY_WAIT_S` for one (a host whose pools have
        more slots than it has sandbox users: a training ends and gives its user back)."""
        STATE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        candidates = [u for u in users() if self.among is None or u.name in self.among]
        deadline = time.monotonic() + BUSY_WAIT_S
        while True:
            for user in candidates:
                fd = self._lock(user)
                if fd is not None:
                    return user, fd
            if time.monotonic() > deadline:
                raise SandboxBusy(
                    f"all {len(candidates)} sandbox users were running trainings for {BUSY_WAIT_S:.0f}s; "
                    "a later try gets one"
                )
            time.sleep(2.0)

    def _clean_up_unlocked(self) -> None:
        for user in users():
            if user == self.user or not _record_path(user).exists():
                continue
            fd = self._lock(user)
            if fd is None:
                continue  # a live launch holds it
            try:
                self._clean_up(user)
            finally:
                os.close(fd)

    @staticmethod
    def _acl_lock() -> contextlib.AbstractContextManager[None]:
        """setfacl (and chmod, which rewrites the ACL's mask) reads, changes and writes a file's whole ACL:
        two launches changing the same directory at once must take turns, or one's entry is lost."""
        return file_lock(STATE_DIR / "acl.lock")

    def _grant(self, user: SandboxUser) -> None:
        protected = protected_paths()
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        targets = list(dict.fromkeys([*self.readable, *self.named, self.work_dir.parent, *_code_dirs()]))
        with self._acl_lock():
            for path in protected:
                close_to_others(path)
            # Inside trainyard's and Airflow's state, every entry beside the way in is closed to others
            # first (the umask keeps new ones closed), so searching a directory on the way leads nowhere else.
            for target in targets:
                for d in [target, *target.parents]:
                    if d.is_dir() and _inside(d, protected):
                        for entry in d.iterdir():
                            close_to_others(entry)
            searched = list(dict.fromkeys(d for t in targets for d in _search_path(t)))
            record = {
                "search": [str(d) for d in searched],
                "read": [str(p) for p in self.readable],
                "work": str(self.work_dir),
            }
            # recorded before granted: a crash leaves nothing unrevoked
            atomic_write(_record_path(user), json.dumps(record).encode())
            _chown_tree(self.work_dir, user.uid, user.gid)
            for d in searched:
                _setfacl("-m", f"u:{user.uid}:x", str(d))
            for p in self.readable:
                _setfacl("-R", "-P", "-m", f"u:{user.uid}:rX", str(p))

    def _clean_up(self, user: SandboxUser) -> None:
        kill_all(user)
        try:
            _remove_owned(user.uid)
            record_path = _record_path(user)
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
        finally:  # the launch's cgroup (named after its user) last: one that will not go keeps no grant alive
            limits.remove(user.name)

    # what the launch uses

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` started through :mod:`~trainyard.training.launchers.sandbox_entry` as this sandbox's user,
        in its namespaces and its cgroup."""
        assert self.user is not None
        uid, gid = str(self.user.uid), str(self.user.gid)
        cgroup = self.enforcement.cgroup if self.enforcement else None
        if self.enforcement is not None and self.enforcement.counts_processes:
            nproc = sandbox_entry.UNLIMITED  # the cgroup counts them, and says so when a fork is refused
        else:
            nproc = str(self.host_limits.processes if self.host_limits else PROCESS_LIMIT)
        cgroups = [a for f in (cgroup.procs_files if cgroup else []) for a in ("--cgroup", f)]
        return [*entry_argv(), "enter", *cgroups, nproc, uid, gid, str(self.work_dir), "--", *argv]

    def limit_reached(self) -> limits.LimitReached | None:
        """Once the command has ended: the error naming each limit that stopped its processes, or None."""
        cgroup = self.enforcement.cgroup if self.enforcement else None
        return cgroup.breaches(self.host_limits) if cgroup and self.host_limits else None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` for the sandboxed command: HOME, TMPDIR and torch.compile's caches in its work
        directory, gloo and NCCL on loopback (the only interface of its network namespace)."""
        tmp = self.work_dir / "tmp"
        return {
            **base,
            "HOME": str(self.work_dir),
            "TMPDIR": str(tmp),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "torchinductor"),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo",
        }


def entry_argv() -> list[str]:
    """The entry's interpreter and file. -I: the root part reads no user site-packages, no PYTHON* variable and
    neither the working nor the script's directory (HOME is the work directory, which the program wrote on an
    earlier try); -S: no site module, so no .pth file of the environment runs as root either: the standard
    library only."""
    return [sys.executable, "-I", "-S", ENTRY]


def joined(argv: list[str], cgroup: limits.LaunchCgroup) -> list[str]:
    """``argv`` run unsandboxed, as the caller, in ``cgroup`` (which the entry joins before it execs)."""
    return [*entry_argv(), "join", *[a for f in cgroup.procs_files for a in ("--cgroup", f)], "--", *argv]


def _record_path(user: SandboxUser) -> Path:
    return STATE_DIR / f"{user.name}.json"
