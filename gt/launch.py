"""The ``gt`` executable: hands the call to this user's client helper when one answers, else runs it here.

A ``gt`` call spends most of its time starting Python and importing the client (asyncio, nats-py, msgspec,
the subcommands); the call itself takes a few milliseconds. The helper (``gt.cli.helper``) has done those
imports once, and its workers (processes forked from it) run the calls, one after another: for each call a
worker takes this process's standard input, output and error (the descriptors themselves, passed over the
socket), working directory, umask and environment, runs the same ``gt.cli.main`` there, and reports the exit
status. So output, colours (``isatty``), piped input, exit codes and Ctrl-C are what they are without the
helper; only the start-up is gone.

The helper is never needed for a correct answer. When none is at the socket (first call, after it idled out or
was killed), the call starts one and waits for it (``START_WAIT_S``), as does a call made while another call's
helper is starting: the start costs what running the call here would, and is paid once. A call runs here when
helpers are off (``GT_HELPER=0``), when the helper refused it (the code changed under it) or never started it,
or when no helper came up; a call it started is never run twice: if the child ends without an exit status,
that is reported (exit 1), not retried.

A polecat's start hook whose answer the witness wrote ahead is answered before any of this (``gt.start_hook``):
the agent's first model request waits for it.

This module imports only built-in modules (no ``socket``, ``signal`` or ``json``: their imports would cost
more than the helper saves; not even ``__future__``, 0.13 ms); the wire format is in ``gt.cli.helper``'s
docstring.
"""

import _signal  # type: ignore[import-not-found]  # `signal` would import enum: 4 ms more
import _socket
import os
import stat
import sys
import time

HELPER_ENV = "GT_HELPER"
"""``0`` runs every call in its own process (no helper used or started)."""
NOT_ROUTED = frozenset({"up", "down", "feed", "dashboard"})
"""Commands that always run in their own process: they supervise processes (``up``, ``down``) or run until
stopped (``feed``, ``dashboard``), so the start-up the helper saves does not matter, and they stay children
of the caller's shell."""
GLOBAL_OPTIONS_WITH_VALUE = frozenset({"--nats-url", "--actor"})
PROTOCOL = b"gt-helper-1"
FORWARDED_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR2)
"""Signals for the call, passed on to the worker running it; ``SIGUSR2`` has it print its tasks' stacks (a call
that does not finish), and is dropped when it comes before the call began."""
MAX_SOCKET_PATH = 108
"""Linux's limit for a Unix socket's path (``sun_path``), the terminating NUL included."""
TAKE_TIMEOUT_S = 5.0
"""How long a call waits for the helper to take it (it normally does within a millisecond) before it runs in
its own process instead."""
START_WAIT_S = 10.0
"""How long a call that found no helper waits for the one it starts (or another call started a moment before)
before it runs in its own process instead. A start takes about half a second on an idle machine and several on a
loaded one; running the call here would pay that start a second time (the same imports), which is what a
polecat's first calls, made in quick succession by a script, did while its helper was still starting."""
START_POLL_S = 0.01
EXIT_INTERRUPTED = 130
EXIT_LOST = 1


class NobodyListens(Exception):
    """No helper is at the socket (none was started, or it ended): one may be started for the call."""


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["agent-hook"]:
        from gt import start_hook  # built-in modules only, as here

        if start_hook.answer(argv):
            sys.stdout.flush()
            os._exit(0)
    path = socket_path() if os.environ.get(HELPER_ENV, "1") != "0" and routed(argv) else None
    if path is None:
        return in_process()
    try:
        try:
            code = via_helper(path, argv)
        except NobodyListens:
            code = via_new_helper(path, argv)
    except KeyboardInterrupt:  # Ctrl-C before the helper had the call: nothing ran
        return EXIT_INTERRUPTED
    if code is not None:
        # Answered: nothing of this process is left to tidy (it imported built-in modules only and printed at
        # most a line to stderr), so it ends without the interpreter's teardown (1.5 ms of a 25 ms call).
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)
    return in_process()


def in_process() -> int:
    from gt.cli.main import main as cli_main

    return cli_main()


def routed(argv: list[str]) -> bool:
    """Whether the helper may run this call: its command is not one of ``NOT_ROUTED``."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in GLOBAL_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg not in NOT_ROUTED
    return True  # `gt --help`, `gt` alone: argparse's answer, from either place


def socket_path() -> str | None:
    """This user's helper socket for this interpreter and this copy of the code, in a directory only this
    user can use (``$XDG_RUNTIME_DIR/gt``, else ``/tmp/gt-<uid>``); None when no such directory can be had,
    and the call runs here."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    name = f"helper-{helper_key()}.sock"
    for base in ([os.path.join(runtime, "gt")] if runtime else []) + [f"/tmp/gt-{uid}"]:  # noqa: S108 (checked)
        path = os.path.join(base, name)
        if len(os.fsencode(path)) < MAX_SOCKET_PATH:  # else too long for a socket: the next place
            return path if _private_directory(base, uid) else None
    return None


def _private_directory(base: str, uid: int) -> bool:
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(base)
    except OSError:
        return False
    # Someone else's, or open to others: never talk to what may not be ours.
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o077


def helper_key() -> str:
    """Tells helpers apart: one per interpreter, code location, import path and polecat session (FNV-1a, 64 bits).
    Computed once per process: the socket's name and every request carry it (the helper's workers compare each
    request's). A session's helper is its own: started in its pane, it ends with the session (its reaper ends every
    process of it), and so never serves another session's call."""
    global _key
    if _key is None:
        parts = (sys.executable, os.path.dirname(__file__), sys.version, os.environ.get("PYTHONPATH", ""))
        text = "\0".join((*parts, os.environ.get("GT_SESSION", "")))
        value = 0xCBF29CE484222325
        for byte in text.encode():
            value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        _key = f"{value:016x}"
    return _key


_key: str | None = None


def request(argv: list[str]) -> bytes:
    """The call as the helper's worker needs it: the key, working directory, umask, arguments, environment."""
    mask = os.umask(0o077)
    os.umask(mask)
    fields = [PROTOCOL, helper_key().encode(), os.fsencode(os.getcwd()), b"%d" % mask, b"%d" % len(argv)]
    fields += [os.fsencode(a) for a in argv]
    fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
    body = b"\0".join(fields)
    return len(body).to_bytes(4, "big") + body


def via_new_helper(path: str, argv: list[str]) -> int | None:
    """The call run by a helper started for it: the one this call starts, or one another call started a moment
    before (it holds the helper's lock, so this call's exits at once); None when none answers within
    ``START_WAIT_S``, or the helpers there were are gone (one that could not start, say): the call runs here."""
    child = spawn_helper(path)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(START_POLL_S)
        try:
            return via_helper(path, argv)
        except NobodyListens:
            pass
        if child is not None and _ended(child):
            child = None
        if child is None and not _helper_alive(path):
            return None
    return None


def _ended(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _helper_alive(path: str) -> bool:
    """Whether the process its lock file names (the helper that holds the lock writes its pid there) is alive."""
    try:
        fd = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        text = os.read(fd, 32)
    except OSError:
        return False  # a directory, say: no helper of ours
    finally:
        os.close(fd)
    try:
        os.kill(int(text), 0)
    except ValueError:
        return False  # not written yet, or not by a helper
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def via_helper(path: str, argv: list[str]) -> int | None:
    """The call's exit status from the helper's worker; None when the helper did not start it (it refused, or
    did not take it in time), so it may run here without running twice.

    Raises:
        NobodyListens: no helper is at the socket.
    """
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)  # a closed standard descriptor cannot be passed: run here
        payload = request(argv)
    except OSError:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        raise NobodyListens from None
    except OSError:
        sock.close()
        return None
    try:
        if not _accepted(sock):
            return None
        fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
        sock.sendmsg([payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except OSError:
        sock.close()
        return None  # no helper, or it went away before it had the call
    try:
        return _outcome(sock)
    finally:
        sock.close()


def _accepted(sock: _socket.socket) -> bool:
    """Whether a helper's worker took the connection (``A``) in time. Only then are the descriptors sent: ones
    queued to a helper that is stopped or hung would keep the caller's pipes open (a `$(gt ...)` would wait)."""
    sock.settimeout(TAKE_TIMEOUT_S)
    try:
        answer = sock.recv(2)
    except TimeoutError:
        os.write(2, b"gt: the client helper did not take the call in time; running it here\n")
        return False  # closing the connection makes a late taker's `A` fail (EPIPE): it never runs the call
    sock.settimeout(None)
    return answer == b"A\n"


def _outcome(sock: _socket.socket) -> int | None:
    child = 0
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child, signum)  # the child, not a process group: it is in the helper's
        elif signum != _signal.SIGUSR2:
            pending.append(signum)

    previous = {signum: _signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        buffer = b""
        while True:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                if not child:
                    return None
                os.write(2, b"gt: the command's process ended without an exit status (was it killed?)\n")
                return EXIT_LOST  # it may have done its work: never run again here
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                kind, value = line[:1], line[1:]
                if kind == b"S":
                    child = int(value)
                    for signum in pending:
                        os.kill(child, signum)
                elif kind == b"X":
                    return int(value)
                else:  # b"R": refused (the code changed under it, or another user): nothing ran
                    return None
    finally:
        for signum, handler in previous.items():
            _signal.signal(signum, handler)
        if pending and not child:
            # Ctrl-C before the helper started anything: stop here, as a call in this process would.
            raise SystemExit(EXIT_INTERRUPTED)


def spawn_helper(path: str) -> int | None:
    """Start a helper, detached (its own session) and quiet; its pid, None when it could not be started (which
    costs nothing but speed). A second one started at the same moment exits at once (the helper holds a lock).
    ``-P``: the working directory is not on its import path (a ``gt/`` there must not stand in for ours)."""
    # The callers' own environments come per call; these are the helper's own. ``GT_SESSION`` is part of the
    # helper's key (``helper_key``), which the helper compares with each request's: without it a session's helper
    # refused every call of its session as "another version of gt", and each ran in its own process.
    keep = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "GT_SESSION")
    env = {k: v for k, v in os.environ.items() if k in keep}
    null = os.devnull
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, path + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    try:
        return os.posix_spawn(
            sys.executable, [sys.executable, "-P", "-m", "gt.cli.helper", path], env, file_actions=actions, setsid=True
        )
    except OSError:
        return None
