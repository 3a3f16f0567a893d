"""(p) One `gt` call as a user makes it, from process start to exit: ``gt ready``, ``gt status``, ``gt bead show``,
``gt bead create``, and an agent's ``gt prime`` and ``gt step done`` (each a step not done yet), against a town of
four services, median wall time over rounds; each through the client helper (what a user gets: gt/launch.py) and
in a process of its own (``GT_HELPER=0``).
(q) A CLI user's ``gt bead create`` throughput: creates one after another, and four at a time (``xargs -P4``),
through the helper and in processes of their own.

(p) ceiling: ``python -c pass`` (the interpreter's start-up alone), timed in the same rounds, interleaved with the
calls; the ratio is ceiling / value (targets: >= 0.67 through the helper, a call at most 1.5x a bare interpreter;
>= 0.33 in its own process, at most 3x). Each figure's note also gives the same call made in-process
(``gt.cli.main.main`` again in one warm interpreter, its parser built once as the helper does: parse the call,
connect, ask or send, print; each call after a ``python -c pass``, the gap the rounds leave between calls), so
the part that start-up and imports cost is read off directly.
(q) ceiling: the same creates sent by one warm process one after another, each waiting for its outcome as `gt`
does (``shared.bus.commands.send``); the ratio says what the per-call process start costs a script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TypeVar

import msgspec

from bench.common import (
    REPO_ROOT,
    Figure,
    provisioned,
    server,
    start_service,
    stop_service,
    store_costs,
    wait_ready,
)
from bench.witness import make_origin
from shared.bus.commands import send
from shared.bus.connection import Connection
from shared.bus.query import ask, ask_json
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, Command, RigAdd, RigPark
from shared.model.queries import mayor, witness

R = TypeVar("R")

SERVICES = ("mayor", "witness", "refinery", "deacon")
CALLS: dict[str, list[str]] = {
    "gt ready": ["ready"],
    "gt status": ["status"],
    "gt bead show": ["bead", "show", "{bead}"],
    "gt bead create": ["bead", "create", "a bench bead"],
    "gt prime": ["prime", "--session", "{session}"],
    "gt step done": ["step", "done", "{step}"],
}
"""Each call's argv; ``{step}`` is a fresh ``BEAD STEP`` each time (a step done again changes nothing: a different
path), ``{session}`` a running session of a hanging agent."""
COMMANDS = frozenset({"gt bead create", "gt step done"})
"""The calls that send a command (stored, settled, answered once its outcome is stored) rather than ask a query."""
AGENT = "GT_AGENT_FAULT=hang gt-agent"
STEPS_PER_BEAD = 6
"""The default formula's (``polecat-work``) steps."""
MODES = {"through the client helper": {}, "in its own process": {"GT_HELPER": "0"}}
"""How a call runs (the environment that makes it so)."""
GOALS = {"through the client helper": 1 / 1.5, "in its own process": 1 / 3}
"""(p)'s goals: at most 1.5x `python -c pass` through the helper, 3x in a process of its own."""

IN_PROCESS = """
import contextlib, io, json, subprocess, sys, time
from gt.cli.main import build_parser, main
parser = build_parser()  # once, as the client helper does
times = []
for argv in json.loads(sys.argv[1]):
    # What comes between two calls in the rounds (a process started and ended): on an idle VM the services'
    # cores go to sleep meanwhile, and a call right after another took 1.1-1.6 ms less than one after a gap.
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv, parser)
    times.append((time.perf_counter() - started) * 1000)
    if code != 0:
        sys.exit(f"gt {' '.join(argv)} exited {code}")
print(json.dumps(times))
"""


def _wall_ms(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def _gt(args: list[str]) -> list[str]:
    """`gt ARGS` as the installed console script runs it (the venv's ``gt``, else ``python -m gt.cli.main``)."""
    script = Path(sys.executable).parent / "gt"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "gt.cli.main", *args]


def _in_process_ms(argvs: list[list[str]], env: dict[str, str]) -> float:
    """Median of the in-process calls after the first, which warms up (imports, first connection)."""
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, json.dumps(argvs)], env=env, capture_output=True, check=True
    )
    times: list[float] = json.loads(done.stdout)
    return statistics.median(times[1:])


class Argvs:
    """Each call's next argv: the same every time, but ``{step}`` a step not done yet."""

    def __init__(self, bead: str, session: str, steps: list[str]) -> None:
        self._values = {"bead": bead, "session": session}
        self._steps = iter(steps)

    def next(self, name: str) -> list[str]:
        values = dict(self._values)
        if "{step}" in CALLS[name]:
            values["step"] = next(self._steps)
        out: list[str] = []
        for part in CALLS[name]:
            # "{step}" is two words (BEAD STEP); the rest one each.
            out += part.format(**values).split() if part == "{step}" else [part.format(**values)]
        return out


def _store_note(stores: tuple[float, float]) -> str:
    single, batch = stores
    return (
        f"of that call, the server's acknowledgements: the command stored {single:.1f} ms, then its event and "
        f"outcome stored as one atomic batch {batch:.1f} ms (this server, this run)"
    )


def _one_calls(env: dict[str, str], argvs: Argvs, rounds: int, stores: tuple[float, float]) -> list[Figure]:
    walls: dict[tuple[str, str], list[float]] = {(name, mode): [] for name in CALLS for mode in MODES}
    bare: list[float] = []
    for _ in range(rounds):
        bare.append(_wall_ms([sys.executable, "-c", "pass"], env))
        for name in CALLS:
            for mode, extra in MODES.items():
                walls[name, mode].append(_wall_ms(_gt(argvs.next(name)), {**env, **extra}))
    ceiling = statistics.median(bare)
    figures = []
    for name in CALLS:
        warm = _in_process_ms([argvs.next(name) for _ in range(rounds + 1)], env)
        for mode in MODES:
            figure = Figure(
                name=f"(p) `{name}` {mode}, process start to exit, median of {rounds}",
                value=statistics.median(walls[name, mode]),
                unit="ms",
                ceiling=ceiling,
                ceiling_name="python -c pass",
                target=f">= {GOALS[mode]:.2f}",
                higher_is_better=False,
                notes=[
                    f"in-process the same call takes {warm:.1f} ms (one warm process, each call after a "
                    "`python -c pass` as in the rounds); start-up and imports are the rest",
                    *([_store_note(stores)] if name in COMMANDS else []),
                    # The least any process making this call could take: an interpreter's start and the call.
                    f"against `python -c pass` + that call ({ceiling + warm:.1f} ms): ratio "
                    f"{(ceiling + warm) / statistics.median(walls[name, mode]):.2f}",
                ],
            )
            print(figure.line(), flush=True)
            figures.append(figure)
    return figures


async def _town(nc: Connection, town: TownConfig, root: Path, *, steps: int) -> Argvs:
    """What the calls need: a bead to show, a session to prime (a hanging agent's), and ``steps`` steps not done
    yet, of beads slung with the default formula to a parked rig (their molecules wait there, no sessions)."""

    async def ok(cmd: Command[R]) -> R:
        cmd = msgspec.structs.replace(cmd, cmd_id=f"bench-{uuid.uuid4().hex[:12]}")
        outcome = await send(nc, town, cmd, timeout=60)
        if (accepted := outcome.accepted) is None:
            raise RuntimeError(f"{cmd}: {outcome}")
        return accepted.result

    origin = make_origin(root)
    await ok(RigAdd(name="bench", repo=str(origin), agent_command=AGENT, max_polecats=1))
    await ok(RigAdd(name="parked", repo=str(origin), agent_command=AGENT))
    await ok(RigPark(name="parked"))
    shown = (await ok(BeadCreate(title="shown"))).id
    await ok(BeadSling(id=shown, rig="bench"))
    session = f"{shown}-1"
    waiting = []
    for i in range(-(-steps // STEPS_PER_BEAD)):
        bead = (await ok(BeadCreate(title=f"steps {i}"))).id
        await ok(BeadSling(id=bead, rig="parked"))
        waiting.append(bead)
    ids = []
    for bead in waiting:
        molecule = await ask_json(nc, mayor.Molecule(bead=bead))
        ids += [f"{bead} {step['id']}" for step in molecule["steps"]]
    deadline = time.monotonic() + 60
    while not await _started(nc, session):
        if time.monotonic() > deadline:
            raise RuntimeError(f"session {session} did not start")
        await asyncio.sleep(0.1)
    return Argvs(shown, session, ids)


async def _started(nc: Connection, session: str) -> bool:
    try:
        return (await ask(nc, witness.Session(id=session))).status == "started"
    except QueryError as exc:
        if exc.code != "not_found":
            raise
        return False


def _create_rate(env: dict[str, str], creates: int, parallel: int) -> float:
    """Creates per second through `gt bead create`, ``parallel`` at a time (as ``xargs -P``)."""
    script = _gt(["bead", "create", "a bench bead"])
    started = time.perf_counter()
    running: list[subprocess.Popen[bytes]] = []
    for _ in range(creates):
        if len(running) >= parallel:
            oldest = running.pop(0)
            if oldest.wait() != 0:
                raise RuntimeError(f"gt bead create exited {oldest.returncode}")
        running.append(subprocess.Popen(script, env=env, stdout=subprocess.DEVNULL))
    for proc in running:
        if proc.wait() != 0:
            raise RuntimeError(f"gt bead create exited {proc.returncode}")
    return creates / (time.perf_counter() - started)


async def _warm_rate(town: TownConfig, creates: int) -> float:
    nc, _ = await provisioned(town.nats_url)
    try:
        started = time.perf_counter()
        for i in range(creates):
            outcome = await send(
                nc, town, BeadCreate(title="a bench bead", cmd_id=f"warm-{i}-{time.time_ns()}"), timeout=10
            )
            if outcome.type != "cmd.accepted":
                raise RuntimeError(f"create {i}: {outcome}")
        return creates / (time.perf_counter() - started)
    finally:
        await nc.close()


async def _throughput(env: dict[str, str], town: TownConfig, creates: int) -> list[Figure]:
    warm = await _warm_rate(town, creates)
    figures = []
    for mode, extra in MODES.items():
        for parallel in (1, 4):
            rate = await asyncio.to_thread(_create_rate, {**env, **extra}, creates, parallel)
            how = "one after another" if parallel == 1 else f"{parallel} at a time (xargs -P{parallel})"
            figure = Figure(
                name=f"(q) `gt bead create` {mode}, {creates} {how}",
                value=rate,
                unit="beads/s",
                ceiling=warm,
                ceiling_name="one warm process sending them one after another",
                notes=[
                    "each call a process of its own (run by one of the helper's workers): start-up, connect, "
                    "store, outcome"
                ],
            )
            print(figure.line(), flush=True)
            figures.append(figure)
    return figures


def _helper_ready(env: dict[str, str], runtime: Path) -> None:
    """The first call starts the helper; the rounds begin once it listens with its spare children forked."""
    subprocess.run(_gt(["ready"]), env=env, capture_output=True, check=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pid = _helper_pid(runtime)
        if pid is not None and len(_children(pid)) >= 2:
            return
        time.sleep(0.05)
    raise RuntimeError(f"no client helper started under {runtime}")


def _helper_pid(runtime: Path) -> int | None:
    for lock in (runtime / "gt").glob("helper-*.sock.lock"):
        text = lock.read_text().strip()
        if text.isdigit() and Path(f"/proc/{text}").exists():
            return int(text)
    return None


def _children(pid: int) -> list[str]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return path.read_text().split() if path.exists() else []


def _stop_helper(runtime: Path) -> None:
    pid = _helper_pid(runtime)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


async def run(rounds: int = 20, creates: int = 100) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="gt-bench-cli-") as tmp, server() as srv:
        home = Path(tmp) / "home"
        runtime = Path(tmp) / "run"  # this run's own client helper, stopped at the end
        runtime.mkdir(mode=0o700)
        service_env = {"GT_HOME": str(home), "GT_TMUX_SOCKET": f"gt-bench-cli-{os.getpid()}"}
        env = {
            **os.environ,
            **service_env,
            "NATS_URL": srv.url,
            "PYTHONPATH": str(REPO_ROOT),
            "XDG_RUNTIME_DIR": str(runtime),
        }
        env.pop("GT_HELPER", None)
        nc, town = await provisioned(srv.url)
        procs = {name: start_service(name, srv.url, env=service_env) for name in SERVICES}
        try:
            for name in procs:
                await wait_ready(nc, name)
            argvs = await _town(nc, town, Path(tmp), steps=rounds * (len(MODES) + 1) + 1)
            await asyncio.to_thread(_helper_ready, env, runtime)
            stores = await store_costs(nc)
            figures = await asyncio.to_thread(_one_calls, env, argvs, rounds, stores)
            figures += await _throughput(env, town, creates)
        finally:
            _stop_helper(runtime)
            for proc in procs.values():
                stop_service(proc)
            Tmux(service_env["GT_TMUX_SOCKET"]).kill_server()  # the hanging agent's session
            await nc.close()
    return figures


if __name__ == "__main__":
    asyncio.run(run())
