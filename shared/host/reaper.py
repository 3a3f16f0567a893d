"""The supervisor each polecat pane runs its agent under: when the session ends, no process of it is left.

``python -I -S reaper.py GRACE -- COMMAND...`` or ``python -I -S reaper.py GRACE --launch FIFO`` (``argv``).
``--launch``: the reaper is started before its command is known (a polecat's pane, while its workspace is made
ready) and waits on FIFO (``make_launch``, private to the reaper's user) until it is given its command and its
whole environment (``give_launch``), then removes it: the pane's start costs the session nothing, and no value
of the agent's environment is ever on a command line (every user of the machine reads command lines: the model keys
an agent is given would be there for its session's whole life, and in the tmux server's, whose command line is the
first session's). Waiting, it has set nothing up: a SIGHUP (its tmux session killed) or SIGTERM ends it.

Then it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process the agent starts, even one
that detached (``setsid``, a double fork, ``nohup ... &``), is re-parented to it when its parent dies, never to
init. When the session ends (the agent exits, or the reaper gets SIGTERM or SIGHUP: the witness's kill, or tmux
closing the pane) it sends SIGTERM to every descendant, SIGKILL after ``GRACE`` seconds to whatever is left (again
and again, so nothing forked meanwhile survives), reaps them all, and exits only when it has no child left: a
subreaper with no child has no descendant.
It exits with the agent's status (128 + the signal that ended it).

Run as root with the agent under ``setpriv`` (``GT_AGENT_USER``) the agent cannot signal it. Run as the agent's own
user (a laptop town) the agent could kill it first; the witness's scan before a worktree is reused
(``services/witness/effects/leftovers.py``) covers that case.

The standard library only, and started with ``-I -S``: it starts in 30-100 ms on a busy 2-core machine, imports
nothing of the project (so an agent's files cannot change what it runs), and runs on whatever Python the witness
runs on.
"""

from __future__ import annotations

import _signal as signal  # type: ignore[import-not-found]  # `signal` imports enum: 12 ms of the pane's start
import ctypes
import errno
import os
import stat
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}
"""Taken through ``sigwaitinfo``: blocked in the reaper, unblocked in the agent before it starts."""
HELD = {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
"""Stop signals from the pane's terminal (a Ctrl-Z meant for the agent): blocked, never stopping the reaper."""
ENDS_SESSION = {signal.SIGTERM, signal.SIGHUP}
KILL_EVERY_S = 0.05


def argv(grace_s: float, launch: str | None = None) -> tuple[str, ...]:
    """The command prefix that runs a command under the reaper; ``launch``: the whole command line of a reaper
    that waits on that FIFO for its command and environment (``give_launch``)."""
    given = ("--launch", launch) if launch is not None else ("--",)
    return (sys.executable, "-I", "-S", os.path.realpath(__file__), f"{grace_s:g}", *given)


def make_launch(path: str) -> None:
    """The FIFO a reaper started with ``--launch path`` waits on: made anew, this user's alone."""
    if os.path.lexists(path):
        os.unlink(path)
    os.mkfifo(path, 0o600)


def give_launch(path: str, command: list[str], env: dict[str, str], *, timeout: float) -> None:
    """Give the reaper waiting on the FIFO at ``path`` its command and its whole environment; it starts the
    command at once. Waits up to ``timeout`` seconds for the reaper to be reading (its Python may still start).

    Raises:
        TimeoutError: no reaper was reading by then (it ended, or never started).
        OSError: ``path`` is no FIFO of ours (a link is never followed), or the reaper went away meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no reaper read {path} within {timeout:g}s") from None
            time.sleep(0.002)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a FIFO")
        os.set_blocking(fd, True)
        payload = b"\0".join(item.encode() for item in [*(f"{k}={v}" for k, v in env.items()), "", *command])
        data = b"%d\n" % len(payload) + payload
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def read_launch(path: str) -> tuple[list[str], dict[str, str]]:
    """Wait on the FIFO at ``path`` until ``give_launch`` gives the command and environment; it is removed.

    Raises:
        OSError: ``path`` is not a FIFO, or what came is not a whole launch (its writer died on the way).
        UnicodeDecodeError: nor is it text.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # blocks until the witness opens it to write
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a FIFO")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
        os.unlink(path)
    size, _, payload = b"".join(chunks).partition(b"\n")
    if not size.isdigit() or int(size) != len(payload):
        raise OSError(f"{path}: an incomplete launch ({len(payload)} bytes, {size[:20]!r} announced)")
    items = payload.decode().split("\0")
    if "" not in items:
        raise OSError(f"{path}: no command in the launch")
    cut = items.index("")  # no variable is empty: the first empty item ends the environment
    command = items[cut + 1 :]
    if not command or not command[0]:
        raise OSError(f"{path}: no command in the launch")
    pairs = (item.partition("=") for item in items[:cut])
    return command, {name: value for name, _, value in pairs}


def main(args: list[str]) -> int:
    launched = len(args) == 3 and args[1] == "--launch"
    if not launched and (len(args) < 3 or args[1] != "--"):
        print("usage: reaper.py GRACE_SECONDS (-- COMMAND [ARG...] | --launch FIFO)", file=sys.stderr)
        return 2
    grace = float(args[0])
    # What ends a session ends it whatever this process inherited (a town started under `nohup` ignores SIGHUP,
    # and an ignored signal is dropped, never waited for): waiting for its launch, the reaper simply ends.
    for sig in ENDS_SESSION:
        signal.signal(sig, signal.SIG_DFL)
    try:
        command, env = read_launch(args[2]) if launched else (args[2:], dict(os.environ))
    except (OSError, UnicodeDecodeError) as exc:
        print(f"reaper: cannot read its launch from {args[2]}: {exc}", file=sys.stderr)
        return 125
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"reaper: cannot become a child subreaper: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 125
    signal.signal(signal.SIGCHLD, lambda *_: None)  # delivered (and queued while blocked), not discarded
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED | HELD)
    agent = os.fork()
    if agent == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        try:
            os.execvpe(command[0], command, env)  # noqa: S606 - the pane's command, as tmux would run it
        except OSError as exc:
            print(f"reaper: cannot run {command[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    status: int | None = None
    while status is None:
        info = signal.sigwaitinfo(WATCHED)
        if info.si_signo == signal.SIGCHLD:
            status = _reap(agent)
        elif info.si_signo in ENDS_SESSION:
            status = 128 + info.si_signo
        # SIGINT, SIGQUIT: the agent's (it is in the pane's foreground process group too); nothing for the reaper.
    end_all(grace)
    return status


def _reap(agent: int) -> int | None:
    """Reap every child that has exited; the agent's exit status when it was one of them."""
    found = None
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == agent:
            found = os.waitstatus_to_exitcode(wait_status)
            found = 128 - found if found < 0 else found


def _has_children() -> bool:
    """Reap what exited; whether a child is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_all(grace: float) -> None:
    """SIGTERM to every descendant, SIGKILL to what is left after ``grace``; returns once none is left."""
    if not _has_children():
        return  # a subreaper with no child has no descendant
    signal_descendants(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _has_children():
        if time.monotonic() >= deadline:
            signal_descendants(signal.SIGKILL)
        signal.sigtimedwait({signal.SIGCHLD}, KILL_EVERY_S)


def signal_descendants(sig: int) -> None:
    me = os.getpid()
    for pid in descendants(me):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # Checked after the pidfd is open: the signal cannot reach a process that took a dead one's pid.
            if me in _ancestors(pid):
                try:  # noqa: SIM105 - contextlib costs the reaper's start-up an import
                    signal.pidfd_send_signal(fd, sig)
                except ProcessLookupError:
                    pass
        finally:
            os.close(fd)


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as file:
            stat = file.read()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def _ancestors(pid: int) -> list[int]:
    out: list[int] = []
    while pid > 1 and len(out) < 4096:
        pid = _parent(pid)
        out.append(pid)
    return out


def descendants(root: int) -> list[int]:
    """Every process below ``root`` now, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            children.setdefault(_parent(int(entry.name)), []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
