"""A town with real parts for witness tests: nats-server, mayor, witness and refinery in this process,
agents in real tmux (a tmux server of the test's own), real git repositories and worktrees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from services.deacon.service import DeaconService
from services.mayor.service import MayorService
from services.refinery.service import RefineryService
from services.refinery.settings import RefinerySettings
from services.witness.service import WitnessService
from services.witness.settings import WitnessSettings
from services.witness.state import Session
from shared.bus import commands as bus_commands
from shared.core.config import TownConfig, town_mark
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, Command, MergeRequestSubmit, RigAdd
from shared.service import Service, ServiceSettings
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually, gt_run, started

FAST = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5, snapshot_check_interval=0.2)
TEST_COMMAND = "test ! -e FAIL_TESTS"
IDENTITY = ("-c", "user.name=Test Polecat", "-c", "user.email=polecat@test.invalid")


async def run_gt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the gt CLI as an agent would, without blocking the services running on this event loop."""
    return await asyncio.to_thread(gt_run, env, *args)


def make_origin(root: Path) -> Path:
    """A bare repository with one commit on main, standing for a project's origin."""
    src = root / "origin-src"
    src.mkdir(parents=True)
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "README.md").write_text("a project the polecats work on\n")
    git.git("add", ".", cwd=src)
    git.git("commit", "--quiet", "-m", "init", cwd=src)
    origin = root / "origin.git"
    git.git("clone", "--quiet", "--bare", str(src), str(origin))
    return origin


def tmux_socket() -> str:
    return f"gt-test-{uuid.uuid4().hex[:10]}"


class PolecatTown:
    """Handles on the running town and helpers to drive it."""

    def __init__(self, town: TownConfig, nc: Client, origin: Path, socket: str) -> None:
        self.config = town
        self.nc = nc
        self.origin = origin
        self.socket = socket
        self.tmux = Tmux(socket, town=town_mark(town))  # as the town's witness sees it: its own sessions only
        self.mayor: MayorService | None = None
        self.witness: WitnessService | None = None
        self.refinery: RefineryService | None = None
        self.deacon: DeaconService | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._services: dict[str, Service[Any]] = {}
        """Every service started (``start``), by the name it was started under."""
        self._count = 0

    async def command(self, subject: str, **body: Any) -> dict[str, Any]:
        """Publish a body on ``subject`` as the nats CLI would (any body, valid or not); its outcome."""
        self._count += 1
        cmd_id = f"t-{uuid.uuid4().hex[:12]}"
        raw = json.dumps({**body, "cmd_id": cmd_id}).encode()
        return await send_and_wait(self.nc, subject, raw, cmd_id)

    async def ok(self, subject: str, **body: Any) -> dict[str, Any]:
        outcome = await self.command(subject, **body)
        assert outcome["type"] == "cmd.accepted", outcome
        result: dict[str, Any] = outcome["result"]
        return result

    async def send(self, cmd: Command) -> dict[str, Any]:
        """Send a typed command as an operator does (``shared.bus.commands.send``); its result once accepted."""
        self._count += 1
        cmd = msgspec.structs.replace(cmd, cmd_id=f"t-{uuid.uuid4().hex[:12]}")
        outcome = await bus_commands.send(self.nc, self.config, cmd, timeout=60, wait_if_down=True)
        assert outcome.type == "cmd.accepted", outcome
        result: dict[str, Any] = msgspec.to_builtins(outcome.result)  # as the outcome carries it
        return result

    async def add_rig(self, name: str = "demo", **options: Any) -> dict[str, Any]:
        options.setdefault("test_command", TEST_COMMAND)
        return await self.send(RigAdd(name=name, repo=str(self.origin), **options))

    async def new_bead(self, title: str = "Make it better", **fields: Any) -> str:
        result = await self.send(BeadCreate(title=title, **fields))
        return str(result["id"])

    async def sling(self, bead: str, rig: str = "demo", **options: Any) -> None:
        await self.send(BeadSling(id=bead, rig=rig, **options))

    # ---- services ------------------------------------------------------------------------------

    async def start(self, which: str, service: Service[Any]) -> None:
        self._tasks[which] = await started(service, name=which)
        self._services[which] = service

    async def start_witness(self, settings: WitnessSettings) -> WitnessService:
        settings = msgspec.structs.replace(settings, tmux_socket=self.socket)  # always the test's own tmux
        self.witness = WitnessService(self.config, FAST, witness=settings)
        await self.start("witness", self.witness)
        return self.witness

    async def stop(self, which: str) -> None:
        service = self._services.pop(which, None)
        task = self._tasks.pop(which, None)
        if service is None or task is None:
            return
        await service.shutdown()
        await asyncio.wait_for(task, 30)

    async def stop_all(self) -> None:
        for which in ("witness", "refinery", "mayor", "deacon", *self._services):
            await self.stop(which)

    # ---- reading state -------------------------------------------------------------------------

    def sessions_of(self, bead: str) -> list[Session]:
        assert self.witness is not None
        state = self.witness.state
        return [state.sessions[s] for s in state.beads[bead].sessions] if bead in state.beads else []

    async def wait_merge_requested(self, bead: str, timeout: float = 90) -> dict[str, Any]:
        def submitted() -> dict[str, Any]:
            assert self.refinery is not None
            found = [m for m in self.refinery.projection.state.mrs.values() if m.bead == bead]
            assert found, f"no merge request for {bead} yet"
            view: dict[str, Any] = msgspec.to_builtins(found[0])
            return view

        mr: dict[str, Any] = await assert_eventually(submitted, timeout=timeout, interval=0.1)
        return mr

    async def wait_settled(self, bead: str, timeout: float = 60) -> list[Session]:
        """Until every session of the bead ended and was cleaned up; returns them."""

        def settled() -> list[Session]:
            sessions = self.sessions_of(bead)
            assert sessions, f"{bead} has no session yet"
            assert all(s.status == "ended" and s.cleaned for s in sessions), [(s.id, s.status) for s in sessions]
            return sessions

        result: list[Session] = await assert_eventually(settled, timeout=timeout, interval=0.1)
        return result

    @staticmethod
    def endings(sessions: list[Session]) -> str:
        """How each session ended and what its pane last showed: for an assertion's message, so a session that
        ended unexpectedly (in CI, once) says why."""
        return "\n".join(f"{s.id}: {s.end_reason} ({s.end_detail})\n{s.pane_tail}" for s in sessions)

    def _ref(self, branch: str) -> str:
        """The branch's commit where the rig's repository has the branch (one pushed there by hand), else main. A
        polecat's branch never is: `gt done` publishes it as a bundle, so its commits are in the rig's repository
        only once the refinery merged them. Wait for that first (its bead closed), or main is read without them."""
        ref = f"refs/heads/{branch}"
        head = git.git("rev-parse", "--verify", "--quiet", ref, cwd=self.origin, check=False).strip()
        return head or "refs/heads/main"

    def branch_files(self, branch: str, bead: str) -> list[str]:
        out = git.git("ls-tree", "--name-only", self._ref(branch), f".gastown-work/{bead}/", cwd=self.origin)
        return sorted(Path(p).name for p in out.split())

    def push_branch(self, branch: str, files: dict[str, str], *, base: str = "main") -> str:
        """Commit ``files`` on a new branch off ``base`` of origin and push it, as a polecat would; its head."""
        return self.push_commits(branch, [dict[str, str | None](files)], base=base)

    def push_commits(self, branch: str, commits: list[dict[str, str | None]], *, base: str = "main") -> str:
        """One commit per dict of ``commits`` (a file's text, None to delete it) on a new branch off ``base``,
        pushed to origin; its head."""
        clone = self.origin.parent / f"scratch-{uuid.uuid4().hex[:8]}"
        git.git("clone", "--quiet", "--branch", base, str(self.origin), str(clone))
        try:
            git.git("checkout", "--quiet", "-b", branch, cwd=clone)
            for files in commits:
                for name, text in files.items():
                    if text is None:
                        git.git("rm", "--quiet", name, cwd=clone)
                    else:
                        (clone / name).write_text(text)
                git.git("add", "-A", ".", cwd=clone)
                git.git(*IDENTITY, "commit", "--quiet", "-m", f"{branch}: {', '.join(files)}", cwd=clone)
            git.git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=clone)
            return git.git("rev-parse", "HEAD", cwd=clone).strip()
        finally:
            git.force_remove(clone)

    async def submit(self, bead: str, branch: str, head: str, rig: str = "demo") -> str:
        """Queue a merge request the way `gt done` does; its id."""
        result = await self.send(MergeRequestSubmit(bead=bead, rig=rig, branch=branch, head=head))
        return str(result["id"])

    def branch_log(self, branch: str) -> list[str]:
        log = git.git("log", "--format=%s", self._ref(branch), cwd=self.origin).splitlines()
        return [line for line in log if not line.startswith("Merge")]


@contextlib.asynccontextmanager
async def polecat_town(
    town: TownConfig,
    nc: Client,
    root: Path,
    settings: WitnessSettings | None = None,
    *,
    with_witness: bool = True,
    with_refinery: bool = True,
    with_mayor: bool = True,
    refinery: RefinerySettings | None = None,
    socket: str | None = None,
) -> AsyncIterator[PolecatTown]:
    """The town; ``with_witness=False`` leaves the witness to the test (a chaos test runs it as a process), as
    ``with_mayor=False`` the mayor;
    ``socket``: a tmux server it shares (with another town), else one of its own."""
    socket = socket or tmux_socket()
    settings = settings or WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    handle = PolecatTown(town, nc, make_origin(root), socket)
    try:
        if with_mayor:
            handle.mayor = MayorService(town, FAST)
            await handle.start("mayor", handle.mayor)
        if with_refinery:
            handle.refinery = RefineryService(town, FAST, refinery=refinery)
            await handle.start("refinery", handle.refinery)
        if with_witness:
            await handle.start_witness(settings)
        yield handle
    finally:
        await handle.stop_all()
        handle.tmux.kill_server()
