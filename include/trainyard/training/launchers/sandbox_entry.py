"""The only trainyard code that runs as root inside a launch: from the task's process into a sandbox user.

The local launcher starts ``python -I -S`` on this file as root (``enter``) with the launch's cgroups, the
process limit, the sandbox user's uid and gid, the run's work directory and the command. It then, in this
order:

1. keeps no descriptor but stdin, stdout and stderr, and puts ``/dev/null`` on stdin. Under Airflow's
   real executor a task's fd 0 is the supervisor's request socket (``GetConnection``, ``GetVariable``,
   ``PutVariable``, ``SetXCom``, ``SucceedTask`` ...); the launcher already gives its child ``/dev/null``
   and closes the rest, and this does it again where it matters, before anything of the user's runs;
2. moves itself into the launch's cgroups (:mod:`~trainyard.training.launchers.limits`: CPU, memory and
   process count), so that every process the job starts is held by them;
3. execs bubblewrap (``bwrap``, a Debian package: the namespaces are its work, not this file's), which
   gives the job a PID namespace with a ``/proc`` of its own (it sees its own processes only, and all of
   them die with the namespace's init, which dies with the launch), a network namespace with loopback
   only (no local service, another job's rendezvous store or the Airflow API is reachable, nor any outside
   network), a mount namespace with a fresh ``/dev/shm``, SysV IPC of its own, and ``no_new_privs``;
4. inside, this file again (``inside``, still root, the namespace's second process): caps the user's
   processes (RLIMIT_NPROC, where no cgroup counts them), gives the command default signal dispositions,
   drops every group, becomes the user (real, effective and saved ids), sets a private umask and the work
   directory and execs the command.

Termination signals (the launcher's SIGTERM to the launch's process group) are ignored by bubblewrap's two
processes and reach the command, which may end gracefully; SIGKILL of the launch, or the launching task's
death, takes bubblewrap down and the whole namespace with it.

``join`` is the unsandboxed variant (a built-in trainer's workers on a host without the sandbox, run by a
root worker): step 1 and 2, then exec the command as the caller.

It imports the standard library only, so what runs as root is this file, bubblewrap, and nothing either
pulls in. Set-up (users, ACLs, cgroups) and clean-up (killing what a command left, revoking what was
granted) are in :mod:`trainyard.training.launchers.sandbox`, which runs as the task's own user or as root
but never enters the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import re
import resource
import shutil
import signal
import sys

USER_PREFIX = "trainyard-run"
# Sandbox users on a host: trainyard-run0 ... trainyard-run63. A sandboxed training holds one for its whole run,
# so they bound the trainings a host runs at once: an 8-GPU host in 7 MIG slices each runs 56. Once they are
# all taken, the next job admitted to the host holds its slots and waits for one (seen with 20 one-slot jobs
# on the CPU type and the 8 users the test suite has of the 16 there were, 2026-12-07).
USERS = 64
# where root looks for bwrap: never the caller's PATH
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The whole host filesystem as it is (the ACLs decide what the user reads), a fresh /proc of the new PID
# namespace, a fresh world-writable /dev/shm; no network but loopback (which bwrap brings up), no SysV IPC
# of the host's; bwrap's own processes die with their parent (the launch).
BWRAP_OPTIONS = (
    "--dev-bind", "/", "/",
    "--unshare-pid", "--unshare-net", "--unshare-ipc",
    "--proc", "/proc",
    "--perms", "1777", "--tmpfs", "/dev/shm",
    "--die-with-parent",
)  # fmt: skip
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULTED = (*TERMINATING, signal.SIGPIPE, signal.SIGXFSZ)  # what Python itself ignores at start-up
PR_SET_NO_NEW_PRIVS = 38
CGROUP_FS = "/sys/fs/cgroup/"
UNLIMITED = "unlimited"


def libc_call(name: str, *args) -> None:
    """Call libc's ``name``; OSError with the errno on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def standard_descriptors_only() -> None:
    """``/dev/null`` on stdin and every descriptor above stderr closed: what this process was handed (a
    supervisor's socket, a log file, a lock) does not reach what it execs."""
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    # every open descriptor by number, not up to the soft limit only: one above it would survive closerange
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def is_sandbox_user(uid: int, gid: int) -> bool:
    """Whether ``uid`` is one of the :data:`USERS` sandbox users set-up creates and ``gid`` its own group."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return False
    found = re.fullmatch(re.escape(USER_PREFIX) + r"([0-9]+)", entry.pw_name)
    return found is not None and int(found[1]) < USERS and entry.pw_gid == gid


def bwrap() -> str:
    """bubblewrap's path, from the system's directories only."""
    found = shutil.which("bwrap", path=SYSTEM_PATH)
    if found is None:
        raise FileNotFoundError("bwrap (bubblewrap) is not installed (Debian: apt-get install bubblewrap)")
    return found


def join_cgroups(procs_files: list[str]) -> None:
    """Move this process into each cgroup whose ``cgroup.procs`` is given (a cgroup's file only)."""
    for path in procs_files:
        real = os.path.realpath(path)
        if not real.startswith(CGROUP_FS) or os.path.basename(real) != "cgroup.procs":
            raise ValueError(f"{path} is not a cgroup's cgroup.procs")
        with open(real, "w") as f:
            f.write(str(os.getpid()))


def inside(nproc: str, uid: int, gid: int, work_dir: str, argv: list[str]) -> None:
    """In bubblewrap's namespaces, as root: become the user and exec ``argv`` (step 4 above). Never returns."""
    if nproc != UNLIMITED:  # else the cgroup counts them; the limit this process was given stays
        resource.setrlimit(resource.RLIMIT_NPROC, (int(nproc), int(nproc)))
    for sig in DEFAULTED:
        signal.signal(sig, signal.SIG_DFL)
    libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # bwrap set it already; kept in this file's account
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.umask(0o077)
    os.chdir(work_dir)
    os.makedirs(os.path.join(work_dir, "tmp"), exist_ok=True)
    os.execvp(argv[0], argv)


def enter(cgroups: list[str], nproc: str, uid: int, gid: int, work_dir: str, argv: list[str]) -> None:
    """Steps 1 to 3 above, then bubblewrap runs this file's :func:`inside`. Never returns."""
    standard_descriptors_only()
    join_cgroups(cgroups)
    for sig in TERMINATING:  # inherited through exec by bwrap's processes; inside() restores them
        signal.signal(sig, signal.SIG_IGN)
    again = [sys.executable, "-I", "-S", os.path.abspath(__file__), "inside", nproc, str(uid), str(gid), work_dir]
    os.execv(bwrap(), [bwrap(), *BWRAP_OPTIONS, "--", *again, "--", *argv])


def _options(args: list[str]) -> tuple[list[str], list[str]]:
    """``--cgroup FILE``... at the front of ``args``: the files and what follows them."""
    cgroups = []
    while len(args) >= 2 and args[0] == "--cgroup":
        cgroups.append(args[1])
        args = args[2:]
    return cgroups, args


USAGE = f"usage (by the local launcher): python -I -S {__file__} enter|inside|join ..."


def main(args: list[str]) -> None:
    """``enter [--cgroup FILE]... NPROC UID GID WORK -- ARGV...`` as root, from the local launcher;
    ``inside NPROC UID GID WORK -- ARGV...`` from bubblewrap; ``join [--cgroup FILE]... -- ARGV...``;
    ``--probe``: only whether this host lets it enter bubblewrap's namespaces (exit status 0)."""
    if args == ["--probe"]:
        os.execv(bwrap(), [bwrap(), *BWRAP_OPTIONS, "--", sys.executable, "-I", "-S", "-c", ""])
    mode, cgroups, rest = (args or [""])[0], *_options(args[1:])
    if mode == "join" and rest[:1] == ["--"] and len(rest) > 1:
        standard_descriptors_only()
        join_cgroups(cgroups)
        os.execvp(rest[1], rest[1:])
    if mode not in ("enter", "inside") or (mode == "inside" and cgroups):
        sys.exit(USAGE)
    if os.geteuid() != 0 or len(rest) < 6 or rest[4] != "--" or not re.fullmatch(r"[0-9]+", rest[1] + rest[2]):
        sys.exit(USAGE)
    if not (rest[0] == UNLIMITED or re.fullmatch(r"[0-9]+", rest[0])):
        sys.exit(f"NPROC is a number or {UNLIMITED!r}, not {rest[0]!r}")
    uid, gid = int(rest[1]), int(rest[2])
    if not is_sandbox_user(uid, gid):
        sys.exit(f"uid {uid} with gid {gid} is not a sandbox user and its own group")
    if mode == "enter":
        enter(cgroups, rest[0], uid, gid, rest[3], rest[5:])
    inside(rest[0], uid, gid, rest[3], rest[5:])


if __name__ == "__main__":
    main(sys.argv[1:])
