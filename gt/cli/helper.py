"""The ``gt`` client helper: one process per user, interpreter and copy of the code that has imported the
client once, and workers forked from it that run the calls (``gt.launch`` says why and how calls reach it).

A worker runs one call after another in the same process, each as the caller's own (its descriptors, working
directory, umask, environment and arguments; put back to the worker's own in between): a process forked per call
paid for it twice over, once in copy-on-write faults on the pages the call touched (some 1,500 of them) and once
in running code the interpreter had not run before in that process (a `gt ready` took 8-10 ms in a fresh child
against 3.5 ms in a warm process). A call that leaves anything behind that the next one could meet (a thread, a
descriptor, an exit handler, replaced standard streams or signal handlers, a Ctrl-C, a crash) is its worker's
last: the worker exits after answering it, and a fresh one is forked. So is the
``MAX_CALLS_PER_WORKER``-th call.

Wire (a Unix stream socket in a directory only its user can open; the peer's uid is checked as well):

- ``A`` from the worker that accepted the connection, first: only then does the caller send its request (a
  caller that waited in vain closes the connection instead, and the late ``A`` fails).
- request: a 4-byte big-endian length, then NUL-separated fields: ``gt-helper-1``, the helper key, the working
  directory, the umask (decimal), the number of arguments, the arguments, then ``KEY=VALUE`` per environment
  variable. The first ``sendmsg`` carries the caller's descriptors 0, 1 and 2 (``SCM_RIGHTS``).
- answer, line by line: ``S<pid>`` once the worker has taken the call (it will not run anywhere else), then
  ``X<code>`` with its exit status; or ``R<reason>`` instead of both when the helper refuses (the call then runs
  in the caller). The worker writes ``S`` and ``X`` itself, so a helper killed mid-call loses nothing. After
  ``X`` the worker waits for the caller to close the connection before it takes another call: until then the
  caller may still forward a Ctrl-C to the worker's pid, which must not reach the next caller's call.

Between a worker and the helper, a pipe: ``T<pid>`` when a worker took a call, ``F<pid>`` when it is free again,
``Q`` when the code changed. The helper keeps ``SPARES`` workers free, forking more when calls come at once; a
worker forked beyond the first ``SPARES`` exits after ``EXTRA_WORKER_IDLE_S`` without a call.

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
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gt import launch

if TYPE_CHECKING:
    from gt.cli.sources import SourceWatch
    from shared.bus.kept import KeptConnections

IDLE_ENV = "GT_HELPER_IDLE"
DEFAULT_IDLE_S = 600.0
MAX_REQUEST = 4 << 20
"""Arguments and environment together; Linux's own limit for a command line is 2 MB."""
_PEER_CRED = struct.Struct("3i")
SPARES = 2
"""Workers kept free, each waiting to take a call: two, so a second call at the same moment does not wait."""
MAX_CALLS_PER_WORKER = 500
"""A worker's last call: what a long-lived process accumulates (memory, caches) stays bounded."""
EXTRA_WORKER_IDLE_S = 30.0
"""How long a worker forked beyond the first ``SPARES`` (for calls at the same moment) waits for a call before it
exits."""
CALLER_CLOSE_S = 1.0
"""How long a worker waits, after answering, for its caller to close the connection; a caller that does not (it
was stopped) may still forward a signal, so the worker exits instead of taking another call."""
WATCHED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGPIPE,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGWINCH,
)
"""Signals whose handling a call could change and a later call would then meet."""


class Refused(Exception):
    """A call the helper will not take; the caller runs it itself."""


class Worker:
    __slots__ = ("extra", "free")

    def __init__(self, *, extra: bool) -> None:
        self.extra = extra
        self.free = True


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
    # Only now the imports (a second helper started at the same moment has exited by here, having paid for
    # none of them), and the whole point: imported once, here.
    from gt.cli import main as cli
    from gt.cli.sources import SourceWatch
    from gt.town import lifecycle  # noqa: F401 (every call without NATS_URL asks it where the town's NATS is)

    parser = cli.build_parser()
    launch.helper_key()  # once, before the workers are forked: each request's key is compared with it
    sources = SourceWatch()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    bound = os.stat(path).st_ino
    server.listen(128)
    idle = float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_S)
    news_r, news_w = os.pipe()
    signal.signal(signal.SIGTERM, _stop)  # `kill` of the helper: clean up (socket, free workers) on the way out
    gc.freeze()  # what is imported stays shared with the workers instead of being copied by their collections
    workers: dict[int, Worker] = {}
    pending = b""
    last_call = time.monotonic()
    try:
        while True:
            while sum(w.free for w in workers.values()) < SPARES:
                extra = sum(not w.extra for w in workers.values()) >= SPARES
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        os.close(news_r)
                        lock.close()
                        code = _worker(server, news_w, sources, parser, cli.main, extra=extra)
                    finally:
                        os._exit(code)  # never back into the helper's loop, whatever happened
                workers[pid] = Worker(extra=extra)
            ready, _, _ = select.select([news_r], [], [], 1.0)
            if ready:
                last_call = time.monotonic()
                pending += os.read(news_r, 4096)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line[:1] == b"Q":
                        return 0  # the code changed: the next call starts a fresh helper
                    worker = workers.get(int(line[1:]))
                    if worker is not None:
                        worker.free = line[:1] == b"F"  # b"T<pid>": took a call; b"F<pid>": free again
            _reap(workers)
            if time.monotonic() - last_call > idle and all(w.free for w in workers.values()):
                return 0
            if not _is_ours(path, bound):
                return 0  # its socket was removed or replaced: no call can reach it, and callers wait for one
    finally:
        if _is_ours(path, bound):
            os.unlink(path)
        server.close()
        for pid, worker in workers.items():
            if worker.free:  # one running a call finishes it (it notices the helper is gone afterwards)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _reap(workers: dict[int, Worker]) -> None:
    """Collect ended workers; a free one that ended is replaced on the next turn."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        workers.pop(pid, None)


def _worker(server: socket.socket, news: int, sources: SourceWatch, parser: object, run: object, *, extra: bool) -> int:
    """A process forked ahead of its calls, which takes connections itself, one call at a time, until a call
    leaves it unfit for another (see the module's docstring), it has run ``MAX_CALLS_PER_WORKER``, the helper is
    gone, or (``extra``) no call came for ``EXTRA_WORKER_IDLE_S``."""
    # A call's dispositions, set once: Ctrl-C interrupts, a terminating signal ends the process. (The helper's
    # own may be "ignore": started from a background job, it inherited that.)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A call sets its own (`gt` prints its tasks' stacks); one its caller forwards as the call ends is ignored.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    parent = os.getppid()
    server.settimeout(1.0)
    from shared.bus.kept import KeptConnections  # imported by the helper before it forked

    connections = KeptConnections()  # before Home: its event loop's descriptors are the worker's own
    home = Home()
    for _ in range(MAX_CALLS_PER_WORKER):
        conn = _accept(server, parent, idle_limit=EXTRA_WORKER_IDLE_S if extra else None, on_idle=connections.expire)
        if conn is None:
            return 0
        os.write(news, b"T%d\n" % os.getpid())
        try:
            conn.sendall(b"A\n")
            call = _receive(conn)
        except (Refused, OSError) as exc:  # refused: said so; the caller gone: nobody to tell
            if isinstance(exc, Refused):
                with contextlib.suppress(OSError):
                    conn.sendall(b"R%s\n" % str(exc).encode())
            conn.close()
            os.write(news, b"F%d\n" % os.getpid())
            continue
        if sources.changed():
            for fd in call.fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(b"Rcode changed\n")
            os.write(news, b"Q\n")
            return 0
        fit = _serve(conn, call, parser, run, home, connections)
        if not fit or os.getppid() != parent:
            return 0
        os.write(news, b"F%d\n" % os.getpid())
    return 0


def _accept(
    server: socket.socket, parent: int, *, idle_limit: float | None, on_idle: Callable[[], None]
) -> socket.socket | None:
    """The next caller's connection; None when the helper is gone or the idle limit passed. ``on_idle`` is called
    each second without one."""
    give_up_at = None if idle_limit is None else time.monotonic() + idle_limit
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent or (give_up_at is not None and time.monotonic() >= give_up_at):
                return None
            on_idle()
        except KeyboardInterrupt:  # a Ctrl-C meant for a call that has ended: this worker stops
            return None
        else:
            return conn


class Home:
    """What a worker is between calls, to go back to after each one and to tell a call that changed it by."""

    __slots__ = ("env", "exit_funcs", "fds", "handlers", "null", "stdin", "streams", "umask")

    def __init__(self) -> None:
        self.null = os.open(os.devnull, os.O_RDWR)
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.env = dict(os.environ)
        self.stdin = sys.stdin
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.handlers = {signum: signal.getsignal(signum) for signum in WATCHED_SIGNALS}
        self.exit_funcs = atexit._ncallbacks()
        self.fds = frozenset(os.listdir("/proc/self/fd"))

    def kept(self, connections: frozenset[str]) -> bool:
        """Whether the call that just ran left the worker as it found it (its connection to the caller closed
        already; ``connections``: the descriptors of the NATS connections kept for the next call)."""
        return (
            threading.active_count() == 1
            and (sys.stdin, sys.stdout, sys.stderr) == self.streams
            and atexit._ncallbacks() == self.exit_funcs
            and all(signal.getsignal(signum) is handler for signum, handler in self.handlers.items())
            and frozenset(os.listdir("/proc/self/fd")) - connections == self.fds
        )

    def restore(self) -> None:
        """Back to the worker's own: no descriptor, directory, umask or environment variable of the caller kept."""
        for fd in (0, 1, 2):
            os.dup2(self.null, fd)
        os.chdir("/")
        os.umask(self.umask)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = ["gt"]
        import structlog  # imported by the helper before it forked

        structlog.contextvars.clear_contextvars()


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


def _serve(
    conn: socket.socket, call: Call, parser: object, run: object, home: Home, connections: KeptConnections
) -> bool:
    """Become the caller's process in all that a call can see, run the call, say how it ended, become the
    worker again. Whether the worker may take another call."""
    conn.settimeout(None)
    for target, fd in enumerate(call.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(call.env)
    time.tzset()
    os.umask(call.umask)
    # The same stream objects, now on the caller's descriptors: code that kept a reference at import (a default
    # argument `out=sys.stdout`) writes to the caller too. Only the buffering follows what the caller has. Standard
    # input is read through a reader of this call's own: what one call read ahead never reaches the next.
    for stream, line_buffering in ((sys.stdout, os.isatty(1)), (sys.stderr, True)):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=line_buffering)
    sys.stdin = open(0, encoding=home.stdin.encoding, errors=home.stdin.errors, closefd=False)  # noqa: SIM115
    sys.argv = ["gt", *call.argv]
    try:
        conn.sendall(b"S%d\n" % os.getpid())
    except OSError:
        home.restore()
        return False  # the caller went away before the call began: nothing to do, nobody to tell
    code, fit = _run(call, parser, run, connections)
    stdin, sys.stdin = sys.stdin, home.stdin
    with contextlib.suppress(OSError, ValueError):
        stdin.close()  # closefd=False: only the reader goes
    if atexit._ncallbacks() != home.exit_funcs:
        # The call registered something to run at exit, as its own process would have: run them all, as the
        # interpreter does, and end this worker (they ran: they are not this worker's to run again).
        atexit._run_exitfuncs()
        fit = False
    home.restore()
    with contextlib.suppress(OSError):
        conn.sendall(b"X%d\n" % code)
    fit = fit and _closed_by_caller(conn)
    conn.close()
    fit = connections.tidy() and fit  # a task the call left running on the loop: cancelled, and unfit
    # What the call dropped in reference cycles is freed now, not during some later call, so a socket held by such
    # a cycle is not taken for one the call left open (0.07 ms, after the caller has its answer).
    gc.collect()
    return fit and home.kept(connections.fds())


def _closed_by_caller(conn: socket.socket) -> bool:
    """Whether the caller closed the connection in time (having read its exit status): from then on no signal it
    forwards can reach this process."""
    conn.settimeout(CALLER_CLOSE_S)
    try:
        while conn.recv(64):
            pass
    except (OSError, KeyboardInterrupt):
        return False
    return True


def _run(call: Call, parser: object, run: object, connections: KeptConnections) -> tuple[int, bool]:
    """The call's exit status, and whether it ended in a way that leaves the worker fit for another call."""
    try:
        os.chdir(call.cwd)
    except OSError as exc:
        print(f"gt: cannot enter the working directory {call.cwd}: {exc.strerror}", file=sys.stderr)
        return 1, True
    fit = True
    try:
        code = run(call.argv, parser, connections)  # type: ignore[operator]
    except SystemExit as exc:  # argparse: --help (0), a usage error (2)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else _said(exc.code))
    except KeyboardInterrupt:  # Ctrl-C before the call's own handling began
        code, fit = launch.EXIT_INTERRUPTED, False
    except Exception:  # noqa: BLE001 (a crash: the caller would have seen the traceback, so it sees it here)
        traceback.print_exc()
        code, fit = 1, False
    if code == launch.EXIT_INTERRUPTED:
        fit = False  # interrupted somewhere in the middle: whatever it was doing is not known to be tidy
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            fit = False  # a stream in an error state (a closed pipe): not handed to the next call
    return int(code), fit


def _said(message: object) -> int:
    print(message, file=sys.stderr)
    return 1


def _is_ours(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
