"""(s) sling -> a Claude Code session's SessionStart hook fired, (t) the orchestrator's CPU per tool call of the
activity path (issue 21, point 4).

(s): mayor and witness as their own processes, a rig with ``--agent claude`` (the real ``claude`` that
    ``./dev setup`` installs), the scripted model server answering nothing (a stall: the session stays at its
    first turn). Per session, from the sling command's publication to the session-start mark the SessionStart
    hook (``gt agent-hook session-start``) leaves in the session's runtime dir; p50 and p99, one session at a
    time. Ceiling: the bare binary started by hand (``claude -p``, the same config home set-up, the same model
    server) until its first request reaches the model server.
(t): what runs per tool call: the PostToolUse hook (``sh -c`` of its redirection, as Claude Code runs a hook
    command) and the witness's share (one observation of the session's activity files: the hook's mark, the
    session-start mark, the transcripts; counted as if every tool call had its own patrol, an upper bound).
    CPU (user + system, children included) per call. Ceiling: a bare ``sh -c true`` hook.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import Figure, percentile, provisioned, server, start_service, stop_service, wait_ready
from bench.witness import command, make_origin
from gt.model_server import Fault, ModelServer, Script, say
from services.witness.effects import runtime_setup
from shared.bus.connection import Connection
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, RigAdd
from shared.model.runtimes import ACTIVITY_HOOK, HOOK_MARK_SESSION_START, SESSION_DIR_ENV, ClaudeRuntime

KEY = "sk-ant-api03-scripted-model-server-bench-key-0123456789abcdefghij"
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}


def silent(name: str) -> Script:
    """A session whose model never answers: it stays at its first turn, which is all (s) needs."""
    return Script(name=name, turns=(say("never sent"),), faults=(Fault(kind="stall", times=None),))


async def run(sessions: int = 5, tool_calls: int = 500) -> list[Figure]:
    figures = await _start(sessions)
    figures.append(_activity_cpu(tool_calls))
    return figures


async def _start(sessions: int) -> list[Figure]:
    runtime = ClaudeRuntime()
    binary = runtime_setup.binary(runtime, os.environ)
    names = [f"start-{n}" for n in range(sessions)] + [f"bare-{n}" for n in range(sessions)]
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-agents-", ignore_cleanup_errors=True) as tmp, server() as srv:
        root = Path(tmp)
        async with ModelServer([silent(name) for name in names]) as model:
            bare = [await _bare_first_request(model, binary, root / f"bare-{n}", f"bare-{n}") for n in range(sessions)]
            model.release()
            nc, _town = await provisioned(srv.url)
            env = {
                "GT_HOME": str(root / "home"),
                "GT_TMUX_SOCKET": socket,
                "GT_KILL_GRACE": "1",
                "GT_CLAUDE_BIN": binary,
                "ANTHROPIC_API_KEY": KEY,
                "ANTHROPIC_BASE_URL": model.base_url,
                **QUIET,
            }
            procs = {name: start_service(name, srv.url, env=env) for name in ("mayor", "witness")}
            try:
                for name in procs:
                    await wait_ready(nc, name)
                origin = make_origin(root)
                await command(nc, RigAdd(name="bench", repo=str(origin), agent_command="claude", max_polecats=sessions))
                hooked = [await _sling_to_hook(nc, root / "home", n) for n in range(sessions)]
            finally:
                model.release()
                for proc in procs.values():
                    stop_service(proc)
                Tmux(socket).kill_server()
                await nc.close()
    note = f"{sessions} sessions one at a time; the model never answers (the session waits at its first turn)"
    return [
        Figure(
            name=f"(s) sling -> Claude Code SessionStart hook fired, p{pct}",
            value=percentile(hooked, pct),
            unit="s",
            ceiling=percentile(bare, pct),
            ceiling_name="bare `claude -p` to its first request to the model server",
            higher_is_better=False,
            notes=[note] if pct == 50 else ["includes worktree, config home, tmux start and the hook's `gt` process"],
        )
        for pct in (50, 99)
    ]


async def _bare_first_request(model: ModelServer, binary: str, root: Path, script: str) -> float:
    """Seconds from starting ``claude -p`` by hand until its first request reaches the model server."""
    project = root / "project"
    env = _bare_home(model, binary, root, project)
    return await _time_first_request(model, binary, project, env, script)


def _bare_home(model: ModelServer, binary: str, root: Path, project: Path) -> dict[str, str]:
    """The bare binary's environment and config home, set up as the witness sets up a session's."""
    project.mkdir(parents=True)
    runtime = ClaudeRuntime()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": model.base_url,
        **QUIET,
        **runtime.env({}, session_dir=str(root), root=os.geteuid() == 0),
    }
    config = Path(env["CLAUDE_CONFIG_DIR"])
    config.mkdir(parents=True)
    state = json.dumps(runtime.first_run_state(str(project), env, runtime_setup.binary_version(binary)))
    (config / ".claude.json").write_text(state)
    (Path(env["HOME"]) / ".claude.json").write_text(state)
    return env


async def _time_first_request(
    model: ModelServer, binary: str, project: Path, env: dict[str, str], script: str
) -> float:
    seen = len(model.requests)
    began = time.monotonic()
    proc = subprocess.Popen(
        [binary, "-p", "--dangerously-skip-permissions", f"Say hello [model-script:{script}]"],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(120):
            while len(model.requests) == seen:
                if proc.poll() is not None:
                    raise RuntimeError(f"bare claude exited with {proc.returncode} before any request")
                await asyncio.sleep(0.005)
        return time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()


async def _sling_to_hook(nc: Connection, gt_home: Path, n: int) -> float:
    """Seconds from slinging a bead to its session's SessionStart hook mark."""
    bead = (await command(nc, BeadCreate(title=f"Start {n} [model-script:start-{n}]"))).id
    began = time.monotonic()
    await command(nc, BeadSling(id=bead, rig="bench"))
    sessions = gt_home / "rigs" / "bench" / "sessions"
    async with asyncio.timeout(180):
        while True:
            if any(sessions.glob(f"{bead}-*/{HOOK_MARK_SESSION_START}")):
                break
            await asyncio.sleep(0.01)
    return time.monotonic() - began


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
