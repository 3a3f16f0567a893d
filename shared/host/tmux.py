"""tmux through libtmux, on a server of our own (its socket name), so nothing else's sessions are touched.

Several towns of one OS user may share a socket (``GT_TMUX_SOCKET``): each session a witness starts carries its
town's mark (``TOWN_OPTION``, set in the same tmux call as the session), and a ``Tmux`` made for a town sees,
kills and reads only sessions with that mark (``snapshot``, ``kill_if_labelled``, ``tail_if_labelled``).

The only module that imports libtmux. Every call is blocking (tmux is a subprocess); async callers run
them in a thread. Panes keep ``remain-on-exit``: when an agent dies its pane stays, dead, so a zombie
(tmux alive, agent dead) is observable and its last output can be read.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import msgspec
from libtmux import Server
from libtmux.exc import LibTmuxException

from shared.core import terminal
from shared.core.errors import GastownError

LABEL_OPTION = "@gt_session"
"""A user option set on each session we start: which gastown session it runs (set in the same tmux call)."""
TOWN_OPTION = "@gt_town"
"""A user option set on each session we start: the mark of the town whose witness started it (``config.town_mark``),
so a town never takes another town's sessions on the same socket for orphans of its own."""
_FORMAT = (
    "#{session_name}\t#{pane_id}\t#{pane_pid}\t#{pane_dead}\t#{session_created}\t#{session_activity}"
    f"\t#{{{LABEL_OPTION}}}\t#{{{TOWN_OPTION}}}"
)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
TAIL_LINES = 20
TAIL_LINE_CHARS = 300
TAIL_CHARS = 2000
_CONTROL = terminal.CONTROL_BUT_TAB


def typeable(text: str) -> str:
    """``text`` without control characters (a tab becomes a space, as the pane shows it): typed into a pane,
    ``\x03`` would interrupt the agent, ``\x1b`` start an escape sequence, a newline press Enter."""
    return _CONTROL.sub("", text.replace("\t", " "))


_NO_SERVER = ("no server running", "error connecting to", "No such file or directory")
_NO_SESSIONS = "no current target"
"""What ``list-panes -a`` says on a server that runs with no session (its last one just ended, the server not
exited yet): no panes, like no server."""
_SERVER_LOST = "server exited unexpectedly"
_SAFE_WORD = re.compile(r"[A-Za-z0-9._@+-]+")
"""Session names and labels that go into a tmux format or command string as they are."""
SERVER_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMUX_TMPDIR")
"""All of our environment the tmux client that starts sessions gets: the client that starts the server gives it
its global environment (``show-environment -g``), which every process on the socket can read; the witness's
holds service passwords. TMUX_TMPDIR: where the socket is, as every other tmux call of ours finds it."""


class TmuxError(GastownError):
    """A tmux command failed."""

    def __init__(self, command: str, detail: str) -> None:
        self.command = command
        self.detail = detail
        super().__init__(f"tmux {command} failed: {detail}")


class PaneInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The first pane of a session: what the witness observes."""

    session: str
    pane_id: str
    pane_pid: int
    dead: bool
    """The pane's process has exited (the pane stays because of remain-on-exit)."""
    created: int
    """When the session was created (seconds since the epoch)."""
    activity: int
    """Last output or input in the session (seconds since the epoch)."""
    label: str = ""
    """The gastown session it was started for (empty: not started by a witness)."""
    town: str = ""
    """The mark of the town that started it (empty: no town's, or started before towns were marked)."""


class Tmux:
    """Sessions on the tmux server at ``socket_name``; with ``town`` (a town's mark), only that town's: the sessions
    it starts carry the mark, and only sessions carrying it are listed, killed by label or read by label."""

    def __init__(self, socket_name: str, town: str = "") -> None:
        if town and not _SAFE_WORD.fullmatch(town):
            raise ValueError(f"a town mark must be letters, digits and ._@+-, got {town!r}")
        self.socket_name = socket_name
        self.town = town
        self._server = Server(socket_name=socket_name)

    def _run(self, *args: str) -> list[str]:
        result = self._server.cmd(*args)
        if result.stderr:
            raise TmuxError(args[0], " ".join(result.stderr))
        return list(result.stdout)

    def ours(self, pane: PaneInfo) -> bool:
        """The session carries this town's mark (any session does for a ``Tmux`` of no town)."""
        return not self.town or pane.town == self.town

    def snapshot(self) -> dict[str, PaneInfo]:
        """Every session of ours (``ours``) with its first pane, in one tmux call; empty when the server is not
        running or has no session."""
        try:
            lines = self._run("list-panes", "-a", "-F", _FORMAT)
        except TmuxError as exc:
            if any(marker in exc.detail for marker in (*_NO_SERVER, _NO_SESSIONS)):
                return {}
            raise
        except LibTmuxException as exc:
            raise TmuxError("list-panes", str(exc)) from exc
        out: dict[str, PaneInfo] = {}
        for line in lines:
            info = _pane_info(line)
            if info is not None and info.session not in out and self.ours(info):
                out[info.session] = info
        return out

    def pane_of(self, name: str) -> PaneInfo | None:
        """Session ``name``'s first pane, or None when there is no such session (or no server): ``snapshot`` of
        one session, whose cost does not grow with the number of sessions. Whichever town's it is (``ours``
        tells): a name taken by another town must be seen to be left alone."""
        try:
            lines = self._run("list-panes", "-s", "-t", f"={name}", "-F", _FORMAT)
        except TmuxError as exc:
            if _no_such_session(exc):
                return None
            raise
        except LibTmuxException as exc:
            raise TmuxError("list-panes", str(exc)) from exc
        infos = [info for line in lines if (info := _pane_info(line)) is not None and info.session == name]
        return infos[0] if infos else None

    def start(
        self,
        name: str,
        command: str | None,
        *,
        cwd: str,
        env: Mapping[str, str] | None,
        label: str = "",
        run_as: Sequence[str] = (),
        supervisor: Sequence[str] = (),
    ) -> PaneInfo:
        """Start session ``name`` running ``command`` (through ``sh -c``) in ``cwd`` with exactly ``env``,
        labelled ``label`` and marked with our town in the same tmux call (so no session of ours is ever seen
        without its label or its mark).

        The pane runs ``env -i <env> sh -c <command>``: a tmux server's global environment is that of whoever
        started it (a witness, with its own credentials and settings), and tmux also replaces PATH with its
        client's; neither may leak into an agent, so the agent gets ``env`` and nothing else. ``run_as``: a command
        prefix the whole runs under (``setpriv`` to the agents' OS user). ``supervisor``: a command prefix that runs
        before ``run_as``, as the tmux server's user (``shared.host.reaper``: the pane's first process). ``command``
        None: the supervisor alone, which is given its command and environment later (the reaper's ``--launch``: no
        value on a command line).

        Raises:
            TmuxError: the session exists already, or tmux refused.
        """
        # -P -F: tmux prints the new pane's facts (pid, ...) itself, so no second call reads them.
        args = ["new-session", "-d", "-P", "-F", _FORMAT, "-s", name, "-c", cwd, "-x", "200", "-y", "50"]
        given = ["env", "-i", *(f"{key}={value}" for key, value in env.items())] if env is not None else []
        argv = [*supervisor, *run_as, *given, "sh", "-c", command] if command is not None else [*supervisor]
        args += [_literal(arg) for arg in argv]
        options = (
            ";",
            "set-option",
            "-t",
            name,
            "remain-on-exit",
            "on",
            ";",
            "set-option",
            "-t",
            name,
            LABEL_OPTION,
            _literal(label),
            ";",
            "set-option",
            "-t",
            name,
            TOWN_OPTION,
            self.town,
        )
        printed: list[str] = []
        for attempt in (1, 2):
            try:
                printed = self._run_clean(*args, *options)
            except TmuxError as exc:
                # The first command on a socket starts its server; tmux 3.3 can lose that race to a server of the
                # same socket shutting down ("server exited unexpectedly"). Nothing was started: start again.
                if attempt == 1 and _SERVER_LOST in exc.detail and name not in self.snapshot():
                    continue
                raise
            break
        # Printed before the label and mark were set (the same call's next commands): they are the ones just given.
        info = _pane_info(printed[0]) if printed else None
        if info is None:
            raise TmuxError("new-session", f"session {name} is not there after starting it")
        return msgspec.structs.replace(info, label=label, town=self.town)

    def _run_clean(self, *args: str) -> list[str]:
        """As ``_run``, the tmux client with only ``SERVER_ENV`` of our environment (see there)."""
        binary = shutil.which("tmux")
        if binary is None:
            raise TmuxError(args[0], "tmux is not installed (not on PATH)")
        env = {key: os.environ[key] for key in SERVER_ENV if key in os.environ}
        done = subprocess.run(
            [binary, "-L", self.socket_name, *args], env=env, capture_output=True, text=True, check=False
        )
        if done.stderr.strip():
            raise TmuxError(args[0], " ".join(line for line in done.stderr.splitlines() if line))
        if done.returncode != 0:
            raise TmuxError(args[0], f"exited {done.returncode}")
        return done.stdout.splitlines()

    def kill(self, name: str) -> bool:
        """Kill session ``name``; False when there was none."""
        try:
            self._run("kill-session", "-t", f"={name}")
        except TmuxError as exc:
            if _no_such_session(exc):
                return False
            raise
        return True

    def kill_if_labelled(self, name: str, label: str) -> bool:
        """Kill session ``name`` only if it carries ``label`` and our town's mark (still the session we mean, not a
        newer one of the same name, nor another town's), checked and done by the tmux server in one call; whether it
        was killed."""
        if not _SAFE_WORD.fullmatch(name) or not _SAFE_WORD.fullmatch(label):
            # Not quotable in a tmux format and command: look first, then kill (two calls).
            pane = self.snapshot().get(name)
            return pane is not None and pane.label == label and self.kill(name)
        target = f"={name}:"
        check = f"#{{==:#{{{LABEL_OPTION}}},{label}}}"
        if self.town:
            check = f"#{{&&:{check},#{{==:#{{{TOWN_OPTION}}},{self.town}}}}}"
        try:
            out = self._run("if-shell", "-F", "-t", target, check, f"kill-session -t ={name}", "display -p kept")
        except TmuxError as exc:
            if _no_such_session(exc):
                return False
            raise
        return out != ["kept"]

    def send_text(self, name: str, text: str) -> None:
        """Type ``text`` into the session's pane (literally, no key names, no control characters), without Enter."""
        self._run("send-keys", "-t", f"={name}:", "-l", "--", typeable(text))

    def send_enter(self, name: str) -> None:
        self.send_key(name, "Enter")

    def send_key(self, name: str, key: str) -> None:
        """Press ``key`` (a tmux key name: ``Enter``, ``C-m``, ...) in the session's pane."""
        self._run("send-keys", "-t", f"={name}:", key)

    def cursor(self, name: str) -> tuple[int, int]:
        """Where the pane's cursor is (column, row): Enter moves it even in a pane whose program reads nothing, where
        the text shown does not change (tmux prints a blank line as it prints the empty rows below it)."""
        [line] = self._run("display-message", "-p", "-t", f"={name}:", "#{cursor_x} #{cursor_y}")
        x, y = line.split()
        return int(x), int(y)

    def capture(self, name: str, lines: int = 200) -> str:
        """The last ``lines`` lines of the pane, as shown."""
        return "\n".join(self._run("capture-pane", "-p", "-J", "-t", f"={name}:", "-S", f"-{lines}"))

    def tail(self, name: str, lines: int = TAIL_LINES) -> str:
        """The pane's last ``lines`` non-blank lines, cleaned and bounded (``clean_tail``)."""
        return clean_tail(self.capture(name, lines=lines * 4), lines)

    def tail_if_labelled(self, name: str, label: str, lines: int = TAIL_LINES) -> str:
        """``tail`` of session ``name`` when it carries ``label`` and is ours (it is still the session we mean), else
        '' (also when there is no such session). One tmux call: it is on the recovery path, before a respawn."""
        target = f"={name}:"
        try:
            out = self._run(
                "display-message", "-p", "-t", target, f"#{{{LABEL_OPTION}}}\t#{{{TOWN_OPTION}}}",
                ";", "capture-pane", "-p", "-J", "-t", target, "-S", f"-{lines * 4}",
            )  # fmt: skip
        except TmuxError as exc:
            if _no_such_session(exc):
                return ""
            raise
        seen_label, _, seen_town = out[0].partition("\t") if out else ("", "", "")
        if seen_label != label or (self.town and seen_town != self.town):
            return ""
        return clean_tail("\n".join(out[1:]), lines)

    def kill_server(self) -> None:
        """Stop this socket's tmux server (tests and `gt down --clean`)."""
        try:
            self._run("kill-server")
        except TmuxError as exc:
            if not any(marker in exc.detail for marker in _NO_SERVER):
                raise


def _no_such_session(exc: TmuxError) -> bool:
    """tmux failed because the session it was pointed at is not there (nor, perhaps, its server)."""
    return "can't find" in exc.detail or any(marker in exc.detail for marker in (*_NO_SERVER, _NO_SESSIONS))


def _pane_info(line: str) -> PaneInfo | None:
    """A line of ``_FORMAT`` read; None when it is not one."""
    parts = line.split("\t")
    if len(parts) != 8:
        return None
    return PaneInfo(
        session=parts[0],
        pane_id=parts[1],
        pane_pid=int(parts[2] or 0),
        dead=parts[3] == "1",
        created=int(parts[4] or 0),
        activity=int(parts[5] or 0),
        label=parts[6],
        town=parts[7],
    )


def clean_tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` non-blank lines of ``text`` without escape sequences or control characters, each line
    and the whole cut to a bound: safe to store in an event and to print in another agent's prompt."""
    kept = []
    for line in _ANSI.sub("", text).splitlines():
        line = _CONTROL.sub("", line).rstrip()
        if line:
            kept.append(line[:TAIL_LINE_CHARS])
    tail = "\n".join(kept[-lines:])
    if len(tail) <= TAIL_CHARS:
        return tail
    # Whole lines only: a line cut at its start reads as something it did not say.
    cut = tail[-TAIL_CHARS:]
    return cut.partition("\n")[2] if "\n" in cut else cut


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _literal(arg: str) -> str:
    """``arg`` as tmux will pass it on: tmux takes an argument ending in ``;`` as a command separator
    (``\\;`` stands for a literal one)."""
    return arg[:-1] + "\\;" if arg.endswith(";") else arg
