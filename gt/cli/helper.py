"""The ``gt`` client helper: one process per user, interpreter and copy of the code that has imported the
client once and forks a child per call (``gt.launch`` says why and how calls reach it).

Wire (a Unix stream socket in a directory only its user can open; the peer's uid is checked as well):

- ``A`` from the child that accepted the connection, first: only then does the caller send its request (a
  caller that waited in vain closes the connection instead, and the late ``A`` fails).
- request: a 4-byte big-endian length, then NUL-separated fields: ``gt-helper-1``, the helper key, the working
  directory, the umask (decimal), the number of arguments, the arguments, then ``KEY=VALUE`` per environment
  variable. The first ``sendmsg`` carries the caller's descriptors 0, 1 and 2 (``SCM_RIGHTS``).
- answer, line by line: ``S<pid>`` once the child has taken the call (it will not run anywhere else), then
  ``X<code>`` with its exit status; or ``R<reason>`` instead of both when the helper refuses (the call then runs
  in the caller). The child writes ``S`` and ``X`` itself, so a helper killed mid-call loses nothing.

The helper exits after ``GT_HELPER_IDLE`` seconds without a call (default 600), and at the first call after
any of its imported source files changed (an upgrade or an edit): that call is refused and runs in the
caller, which starts a fresh helper.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import io
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Sequence

from gt import launch

IDLE_ENV = "GT_HELPER_IDLE"
DEFAULT_IDLE_S = 600.0
MAX_REQUEST = 4 << 20
"""Arguments and environment together; Linux's own limit for a command line is 2 MB."""
_PEER_CRED = struct.Struct("3i")
SPARES = 2
"""Children forked ahead of calls, each waiting to take one: two, so a second call at the same moment does
not wait for a fork."""


class Refused(Exception):
    """A call the helper will not take; the caller runs it itself."""


def main(argv: Sequence[str] | None = None) -> int:
    path = (argv if argv is not None else sys.argv[1:])[0]
    lock = open(path + ".lock", "a")  # noqa: SIM115 (held for the helper's life: one helper per socket)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another helper has this socket
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # which process is the helper, for whoever wonders
    lock.flush()
    os.chdir("/")
    from gt import supervisor  # noqa: F401 (every call without NATS_URL asks it where the town's NATS is)
    from gt.cli import main as cli  # the whole point: imported once, here

    parser = cli.build_parser()
    launch.helper_key()  # once, before the spares are forked: each request's key is compared with it
    sources = _sources()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    bound = os.stat(path).st_ino
    server.listen(128)
    idle = float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_S)
    taken_r, taken_w = os.pipe()
    signal.signal(signal.SIGTERM, _stop)  # `kill` of the helper: clean up (socket, spares) on the way out
    gc.freeze()  # what is imported stays shared with the children instead of being copied by their collections
    spares: set[int] = set()
    pending = b""
    last_call = time.monotonic()
    try:
        while True:
            while len(spares) < SPARES:
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        os.close(taken_r)
                        lock.close()
                        code = _spare(server, taken_w, sources, parser, cli.main)
                    finally:
                        os._exit(code)  # never back into the helper's loop, whatever happened
                spares.add(pid)
            ready, _, _ = select.select([taken_r], [], [], 1.0)
            if ready:
                last_call = time.monotonic()
                pending += os.read(taken_r, 4096)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line[:1] == b"Q":
                        return 0  # the code changed: the next call starts a fresh helper
                    spares.discard(int(line[1:]))  # b"T<pid>": taken by a call
            _reap(spares)
            if time.monotonic() - last_call > idle:
                return 0
    finally:
        if _is_ours(path, bound):
            os.unlink(path)
        server.close()
        for pid in spares:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _reap(spares: set[int]) -> None:
    """Collect ended children; a spare that died (killed by someone) is replaced on the next turn."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        spares.discard(pid)


def _spare(server: socket.socket, taken: int, sources: dict[str, int], parser: object, run: object) -> int:
    """A child forked ahead of its call, which takes the next connection itself: a call does not wait for a
    fork. (What was imported stays frozen for its collector: touching it all ahead, to fault in the copied pages
    early, cost more CPU than it saved, measured with four calls at a time.)"""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()
    server.settimeout(1.0)
    while True:
        try:
            conn, _ = server.accept()
            break
        except TimeoutError:
            if os.getppid() != parent:
                return 0  # the helper is gone: so is this spare
    os.write(taken, b"T%d\n" % os.getpid())
    server.close()
    try:
        conn.sendall(b"A\n")
        call = _receive(conn)
    except Refused as exc:
        with contextlib.suppress(OSError):
            conn.sendall(b"R%s\n" % str(exc).encode())
        return 0
    except OSError:
        return 0
    if _changed(sources):
        for fd in call.fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(b"Rcode changed\n")
        os.write(taken, b"Q\n")
        return 0
    os.close(taken)
    return _child(conn, call, parser, run)


class Call:
    __slots__ = ("argv", "cwd", "env", "fds", "umask")

    def __init__(self, fds: list[int], cwd: str, umask: int, argv: list[str], env: dict[str, str]) -> None:
        self.fds, self.cwd, self.umask, self.argv, self.env = fds, cwd, umask, argv, env


def _receive(conn: socket.socket) -> Call:
    """Read one request; the caller's descriptors are closed again when it is refused."""
    conn.settimeout(5)
    uid = _PEER_CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CRED.size))[1]
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    try:
        return _parse(conn, data, fds, same_user=uid == os.getuid())
    except (Refused, ValueError, IndexError) as exc:
        for fd in fds:
            os.close(fd)
        raise Refused(str(exc) or "unreadable request") from None


def _parse(conn: socket.socket, data: bytes, fds: list[int], *, same_user: bool) -> Call:
    if not same_user:
        raise Refused("another user")
    if len(fds) != 3:
        raise Refused("expected the caller's descriptors 0, 1 and 2")
    if len(data) < 4:
        raise Refused("short request")
    size = int.from_bytes(data[:4], "big")
    if size > MAX_REQUEST:
        raise Refused("request too large")
    body = data[4:]
    while len(body) < size:
        more = conn.recv(min(1 << 20, size - len(body)))
        if not more:
            raise Refused("request cut short")
        body += more
    fields = body.split(b"\0")
    if fields[0] != launch.PROTOCOL or fields[1].decode() != launch.helper_key():
        raise Refused("another version of gt")
    argc = int(fields[4])
    argv = [os.fsdecode(f) for f in fields[5 : 5 + argc]]
    env = dict(os.fsdecode(f).partition("=")[::2] for f in fields[5 + argc :] if f)
    return Call(fds, os.fsdecode(fields[2]), int(fields[3]), argv, env)


def _child(conn: socket.socket, call: Call, parser: object, run: object) -> int:
    """Become the caller's process in all that a call can see, run the call, say how it ended."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.settimeout(None)
    for target, fd in enumerate(call.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(call.env)
    time.tzset()
    os.umask(call.umask)
    # The same stream objects, now on the caller's descriptors: code that kept a reference at import (a default
    # argument `out=sys.stdout`) writes to the caller too. Only the buffering follows what the caller has.
    for stream, line_buffering in ((sys.stdout, os.isatty(1)), (sys.stderr, True)):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=line_buffering)
    sys.argv = ["gt", *call.argv]
    try:
        conn.sendall(b"S%d\n" % os.getpid())
    except OSError:
        return 1  # the caller went away before the call began: nothing to do, nobody to tell
    code = _run(call, parser, run)
    with contextlib.suppress(OSError):
        conn.sendall(b"X%d\n" % code)
    return code


def _run(call: Call, parser: object, run: object) -> int:
    try:
        os.chdir(call.cwd)
    except OSError as exc:
        print(f"gt: cannot enter the working directory {call.cwd}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        code = run(call.argv, parser)  # type: ignore[operator]
    except SystemExit as exc:  # argparse: --help (0), a usage error (2)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else _said(exc.code))
    except KeyboardInterrupt:  # Ctrl-C before the call's own handling began
        code = launch.EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 (a crash: the caller would have seen the traceback, so it sees it here)
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as the interpreter would at exit; the child ends with os._exit
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()  # type: ignore[union-attr]
    return int(code)


def _said(message: object) -> int:
    print(message, file=sys.stderr)
    return 1


def _sources() -> dict[str, int]:
    """Modification times of the files the helper imported (and the directories packages install into)."""
    seen: dict[str, int] = {}
    stdlib = os.path.dirname(os.__file__)  # changes only with the interpreter, which is part of the key
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and ("site-packages" in path or not path.startswith(stdlib + os.sep)):
            with contextlib.suppress(OSError):
                seen[path] = os.stat(path).st_mtime_ns
    for directory in {p[: p.index("site-packages") + 13] for p in seen if "site-packages" in p}:
        with contextlib.suppress(OSError):
            seen[directory] = os.stat(directory).st_mtime_ns
    return seen


def _changed(sources: dict[str, int]) -> bool:
    for path, mtime in sources.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


def _is_ours(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
