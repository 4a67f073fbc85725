"""The only trainyard code that runs as root inside a launch: from the task's process into a sandbox user.

The local launcher starts ``python -I -c`` on :func:`main` as root with the sandbox user's uid and gid, the
run's work directory and the command. :func:`enter` then, in this order:

1. keeps no descriptor but stdin, stdout and stderr, and puts ``/dev/null`` on stdin. Under Airflow's
   real executor a task's fd 0 is the supervisor's request socket (``GetConnection``, ``GetVariable``,
   ``PutVariable``, ``SetXCom``, ``SucceedTask`` ...); the launcher already gives its child ``/dev/null``
   and closes the rest, and this does it again where it matters, before anything of the user's runs;
2. unshares a network namespace (loopback only: no local service, another job's rendezvous store or the
   Airflow API is reachable, nor any outside network), a mount namespace (a fresh ``/dev/shm``) and SysV IPC;
3. caps the user's processes (a fork bomb stops at :data:`PROCESS_LIMIT`), sets ``no_new_privs``, drops
   every group, becomes the user (real, effective and saved ids) and execs the command.

It imports the standard library only, so what runs as root is this file and nothing it pulls in. Set-up
(users, ACLs) and clean-up (killing what a command left, revoking what was granted) are in
:mod:`trainyard.training.launchers.sandbox`, which runs as the task's own user or as root but never
enters the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pwd
import re
import resource
import socket
import struct
import sys

USER_PREFIX = "trainyard-run"
USERS = 16  # sandbox users on a host: trainyard-run0 ... trainyard-run15
PROCESS_LIMIT = 4096  # RLIMIT_NPROC of a sandbox user: a fork bomb stops there
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
NAMESPACES = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC  # a sandbox's own network, mounts and SysV IPC
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 0x4000, 1 << 18
PR_SET_NO_NEW_PRIVS = 38


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


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def enter(uid: int, gid: int, work_dir: str, argv: list[str]) -> None:
    """Into the sandbox as described above, then exec ``argv``. Never returns."""
    standard_descriptors_only()
    libc_call("unshare", NAMESPACES)
    libc_call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here leaks out
    libc_call("mount", b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777")
    _loopback_up()
    resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))
    libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.umask(0o077)
    os.chdir(work_dir)
    os.makedirs(os.path.join(work_dir, "tmp"), exist_ok=True)
    os.execvp(argv[0], argv)


def main(args: list[str]) -> None:
    """``UID GID WORK -- ARGV...``, as root, from the local launcher; ``--probe``: only whether this host
    lets it unshare the namespaces (exit status 0)."""
    if args == ["--probe"]:
        libc_call("unshare", NAMESPACES)
        return
    if os.geteuid() != 0 or len(args) < 5 or args[3] != "--" or not re.fullmatch(r"[0-9]+", args[0] + args[1]):
        sys.exit(f"usage (as root, by the local launcher): python -I {__file__} UID GID WORK -- ARGV...")
    uid, gid = int(args[0]), int(args[1])
    if not is_sandbox_user(uid, gid):
        sys.exit(f"uid {uid} with gid {gid} is not a sandbox user and its own group")
    enter(uid, gid, args[2], args[4:])


if __name__ == "__main__":
    main(sys.argv[1:])
