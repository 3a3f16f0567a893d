"""(s) sling -> each agent runtime's first model request, (t) the orchestrator's CPU per tool call of the
activity path (issue 21, point 4; issue 42).

(s): mayor and witness as their own processes, a rig per runtime with a binary (``shared.model.runtimes.RUNTIMES``:
    Claude Code, Codex CLI, Gemini CLI, OpenCode, each the pinned real binary ``./dev setup`` installs), the
    witness's environment pointing each at the scripted model server in its vendor's API as an operator would
    (``tests.agent_runtimes``), the model never answering (a stall: the session stays at its first turn). Per
    session, from the sling command's publication to the arrival at the model server of the session's first model
    request: the first request naming its script, a turn or a side request (a title, a router call), whichever
    comes first (a health check or a token count names none). One session at a time; each session's bead is then
    closed, as a merged bead is, so its workspace is released and settled for the polecat's next bead before the
    next sling (an idle polecat's, as a town at work keeps them: docs/architecture.md, "Workspaces that last"); the
    first session of each rig makes its workspace. p50 and p99.
    Ceiling, in the same run (one bare start right before each session): the bare binary started by hand as the
    witness starts it, in a tmux pane with the runtime's ``env()`` and ``command()`` in a clone of the same
    origin, its config home prepared by ``runtime_setup.prepare`` (first-run state, provider, trust) with hooks
    that run ``true`` instead of ``gt``; no reaper, no town. Until its first model request arrives, the same
    request as above.
(t): what runs per tool call: the PostToolUse hook (``sh -c`` of its redirection, as Claude Code runs a hook
    command) and the witness's share (one observation of the session's activity files: the hook's mark, the
    session-start mark, the transcripts; counted as if every tool call had its own patrol, an upper bound).
    CPU (user + system, children included) per call. Ceiling: a bare ``sh -c true`` hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psutil

from bench.common import Figure, percentile, provisioned, server, start_service, stop_service, wait_ready
from bench.witness import command, make_origin
from gt.model_server import Fault, ModelServer, Script, say
from services.witness.effects import runtime_setup
from services.witness.effects.agent_env import AGENT_TERM
from shared.bus.connection import Connection
from shared.core import subjects
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import BeadClose, BeadCreate, BeadSling, RigAdd
from shared.model.events import decode_envelope
from shared.model.runtimes import (
    ACTIVITY_HOOK,
    HOOK_MARK_SESSION_START,
    RUNTIMES,
    SESSION_DIR_ENV,
    ClaudeRuntime,
    Runtime,
)
from tests.agent_runtimes import RUNTIMES as CLIS  # the conformance suite's pinned binaries and settings

QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
"""Claude Code's settings an operator sets to keep it from calling home (telemetry, update checks)."""
FIRST_REQUEST_TIMEOUT_S = 180.0
CLEANUP_TIMEOUT_S = 120.0
GOAL = 1.1
"""Issue 42: a session's first model request at most 1.1x the bare binary's."""


def binary_runtimes() -> list[Runtime]:
    """The runtimes that start a binary of their own (a command line of the rig's own is not measured)."""
    return [runtime for factory in RUNTIMES.values() if (runtime := factory()).binary_name]


def witness_env(runtimes: list[Runtime], base_url: str) -> dict[str, str]:
    """Every runtime's settings as an operator gives them to the witness against the model server at
    ``base_url`` (they share nothing but OpenAI's, the same for Codex CLI and OpenCode)."""
    clis = {cli.name: cli for cli in CLIS}
    env = dict(QUIET)
    for runtime in runtimes:
        env.update(clis[runtime.name].witness_env(base_url))
    return env


def silent(name: str) -> Script:
    """A session whose model never answers: it stays at its first turn, which is all (s) needs."""
    return Script(name=name, turns=(say("never sent"),), faults=(Fault(kind="stall", times=None),))


def script_names(runtime: Runtime, sessions: int) -> tuple[list[str], list[str]]:
    """(the slung sessions' scripts, the bare starts' scripts) of ``runtime``."""
    return (
        [f"{runtime.name}-start-{n}" for n in range(sessions)],
        [f"{runtime.name}-bare-{n}" for n in range(sessions)],
    )


async def run(sessions: int = 10, tool_calls: int = 500) -> list[Figure]:
    figures = await _start(sessions)
    figures.append(_activity_cpu(tool_calls))
    return figures


class SessionEnds:
    """Which beads' sessions were cleaned up (``session.cleaned``), from a core subscription to session events."""

    def __init__(self) -> None:
        self.bead_of: dict[str, str] = {}
        self.cleaned: set[str] = set()
        """Beads one of whose sessions was cleaned up."""
        self.changed = asyncio.Event()

    async def subscribe(self, nc: Connection) -> None:
        async def on_msg(msg: Any) -> None:
            env = decode_envelope(msg.data)
            data = msgspec.json.decode(env.data)
            if env.type == "session.requested":
                self.bead_of[data["session_id"]] = data["bead"]
            elif env.type == "session.cleaned" and data["session_id"] in self.bead_of:
                self.cleaned.add(self.bead_of[data["session_id"]])
                self.changed.set()

        await nc.subscribe(subjects.event_subject("session", ">"), cb=on_msg)

    async def wait_cleaned(self, bead: str) -> None:
        async with asyncio.timeout(CLEANUP_TIMEOUT_S):
            while bead not in self.cleaned:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Bench:
    """What every start of (s) uses: the town (its connection, the session ends seen), the model server, the bare
    starts' tmux server and the witness's environment they are prepared from, the origin every rig clones."""

    nc: Connection
    ends: SessionEnds
    model: ModelServer
    bare_tmux: Tmux
    agents_env: dict[str, str]
    root: Path
    origin: Path


async def _start(sessions: int) -> list[Figure]:
    runtimes = binary_runtimes()
    scripts = [name for runtime in runtimes for pair in script_names(runtime, sessions) for name in pair]
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="gt-bench-agents-", ignore_cleanup_errors=True) as tmp, server() as srv:
        root = Path(tmp)
        async with ModelServer([silent(name) for name in scripts]) as model:
            agents_env = witness_env(runtimes, model.base_url)
            nc, _town = await provisioned(srv.url)
            env = {"GT_HOME": str(root / "home"), "GT_TMUX_SOCKET": socket, "GT_KILL_GRACE": "1", **agents_env}
            procs = {name: start_service(name, srv.url, env=env) for name in ("mayor", "witness")}
            bench = Bench(nc, SessionEnds(), model, Tmux(f"{socket}-bare"), agents_env, root, make_origin(root))
            try:
                for name in procs:
                    await wait_ready(nc, name)
                await bench.ends.subscribe(nc)
                for runtime in runtimes:
                    figures += _start_figures(runtime, *await _starts(bench, runtime, sessions))
            finally:
                model.release()
                for proc in procs.values():
                    stop_service(proc)
                Tmux(socket).kill_server()
                bench.bare_tmux.kill_server()
                await nc.close()
    return figures


async def _starts(bench: Bench, runtime: Runtime, sessions: int) -> tuple[list[float], list[float]]:
    """(sling -> first request, bare start -> first request) of ``sessions`` sessions of a rig of ``runtime``, a
    bare start right before each session."""
    await command(bench.nc, RigAdd(name=runtime.name, repo=str(bench.origin), agent_command=runtime.name))
    slung: list[float] = []
    bare: list[float] = []
    for start_script, bare_script in zip(*script_names(runtime, sessions), strict=True):
        bare.append(await _bare_first_request(bench, runtime, bare_script))
        slung.append(await _sling_to_first_request(bench, runtime.name, start_script))
    return slung, bare


def _start_figures(runtime: Runtime, hooked: list[float], bare: list[float]) -> list[Figure]:
    sessions = len(hooked)
    notes = {
        50: f"{sessions} sessions one at a time, a bare start before each; the model never answers",
        99: "includes the sling, the workspace (made for the first session, moved by the change from where the last "
        "bead's release settled it for the others), config home, the launch into the pane opened meanwhile (tmux and "
        "the pane's reaper start while the workspace is made ready), and where the runtime waits on its start hook, "
        "the hook's fast path (the answer the witness wrote before the launch)",
    }
    return [
        Figure(
            name=f"(s) sling -> {runtime.name}'s first model request, p{pct}",
            value=percentile(hooked, pct),
            unit="s",
            ceiling=percentile(bare, pct),
            ceiling_name=f"bare `{runtime.binary_name}` in a tmux pane to its first model request",
            target=f"<= {GOAL}x (ratio >= {1 / GOAL:.2f})",
            higher_is_better=False,
            notes=[notes[pct]],
        )
        for pct in (50, 99)
    ]


async def _bare_first_request(bench: Bench, runtime: Runtime, script: str) -> float:
    """Seconds from starting the bare binary by hand in a tmux pane until its first model request arrives."""
    project = bench.root / "bare" / script / "project"
    git.git("clone", "--quiet", str(bench.origin), str(project))
    binary, added = runtime_setup.prepare(
        runtime,
        worktree=project,
        session_dir=project.parent / "session",
        env=bench.agents_env,
        as_root=os.geteuid() == 0,
        gt="true",  # hooks that do nothing: what our `gt` adds is the measured side's
    )
    env = {"PATH": os.environ.get("PATH", ""), "TERM": AGENT_TERM, **added}
    line = runtime.command(f"Say hello [model-script:{script}]", binary)
    began = time.time()
    bench.bare_tmux.start(script, line, cwd=str(project), env=env)
    try:
        return await _first_request(bench.model, script, bench.bare_tmux) - began
    finally:
        _end_pane(bench.bare_tmux, script)


async def _sling_to_first_request(bench: Bench, rig: str, script: str) -> float:
    """Seconds from slinging a bead to its session's first model request; its bead is closed after, its session
    ended and its workspace settled, so the next one starts alone, as an idle polecat's."""
    bead = (await command(bench.nc, BeadCreate(title=f"Start [model-script:{script}]"))).id
    began = time.time()
    await command(bench.nc, BeadSling(id=bead, rig=rig))
    try:
        return await _first_request(bench.model, script) - began
    finally:
        await command(bench.nc, BeadClose(id=bead, reason="measured"))
        await bench.ends.wait_cleaned(bead)
        await _settled(bench, rig)


async def _settled(bench: Bench, rig: str) -> None:
    """Until ``rig``'s released workspace is settled for its polecat's next bead (``git.settle_released``: the record
    the next start takes), as an idle polecat's is when a bead is slung to it."""
    records = bench.root / "home" / "rigs" / rig / "workspaces"
    async with asyncio.timeout(CLEANUP_TIMEOUT_S):
        while True:
            if any(records.glob("*.settled")):
                return
            await asyncio.sleep(0.01)


async def _first_request(model: ModelServer, script: str, tmux: Tmux | None = None) -> float:
    """When (``time.time()``) the first request naming ``script`` reached the model server (``tmux``: the bare
    pane's server, whose pane named ``script`` is shown when none came)."""
    try:
        async with asyncio.timeout(FIRST_REQUEST_TIMEOUT_S):
            while True:
                arrived = [request.received_at for request in model.requests if request.script == script]
                if arrived:
                    return min(arrived)
                await asyncio.sleep(0.005)
    except TimeoutError:
        shown = tmux.tail(script) if tmux is not None else ""
        raise RuntimeError(f"no model request of {script} within {FIRST_REQUEST_TIMEOUT_S:g}s\n{shown}") from None


def _end_pane(tmux: Tmux, name: str) -> None:
    """End a bare pane and everything its binary started (one survives the SIGHUP of a closed pane)."""
    pane = tmux.pane_of(name)
    if pane is not None:
        try:
            top = psutil.Process(pane.pane_pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
    tmux.kill(name)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _hook_cpu(command: str, calls: int, env: dict[str, str]) -> float:
    """CPU seconds per ``sh -c command`` run (the shell's and its children's)."""
    before = _children_cpu()
    for _ in range(calls):
        subprocess.run(["sh", "-c", command], env=env, check=True)
    return (_children_cpu() - before) / calls


def _activity_cpu(calls: int) -> Figure:
    runtime = ClaudeRuntime()
    with tempfile.TemporaryDirectory(prefix="gt-bench-activity-") as tmp:
        session_dir = Path(tmp)
        transcripts = session_dir / "home" / ".claude" / "projects" / "-work-rig-polecats-ace"
        transcripts.mkdir(parents=True)
        (transcripts / f"{uuid.uuid4()}.jsonl").write_text('{"type":"user"}\n' * 200)
        (session_dir / HOOK_MARK_SESSION_START).touch()
        env = {"PATH": os.environ.get("PATH", ""), SESSION_DIR_ENV: str(session_dir)}
        bare = _hook_cpu("true", calls, env)
        hook = _hook_cpu(ACTIVITY_HOOK, calls, env)
        before = _own_cpu()
        for _ in range(calls):
            if runtime_setup.last_activity(session_dir, runtime.activity_files) is None:
                raise RuntimeError("the activity files were not seen")
        witness = (_own_cpu() - before) / calls
    ms = 1000.0
    return Figure(
        name="(t) orchestrator CPU per tool call of the activity path (PostToolUse hook + the witness's share)",
        value=(hook + witness) * ms,
        unit="ms",
        ceiling=bare * ms,
        ceiling_name="a bare `sh -c true` hook",
        higher_is_better=False,
        notes=[
            f"hook {hook * ms:.2f} ms + witness {witness * ms:.3f} ms (one observation per call, an upper bound); "
            f"{calls} calls; a `gt` process per call would cost about 165 ms"
        ],
    )
