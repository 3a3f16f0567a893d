"""`gt crew add|list|attach|remove` and a crew member's own `gt prime` and `gt done` (docs/crew.md).

A crew member is a named workspace of a rig (a repository of its own on ``crew/<name>``) that the witness keeps.
A person works in it (`gt crew attach` opens a shell there, ``GT_CREW`` set) and submits the branch with `gt done`;
a bead hooked to it (`gt sling BEAD RIG --crew NAME`) is worked there by an agent session the witness supervises,
whose own `gt prime` and `gt done` are a polecat session's."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gt.cli import client, render
from gt.cli.common import EXIT_OK, EXIT_REJECTED, Subcommands, UsageError, read_typed, send, show
from gt.cli.done_steps import DoneError, dirty_refusal, done_step, failed, reported
from gt.town.sessions import tmux_socket
from shared.core.config import TownConfig
from shared.host import git
from shared.host.tmux import SERVER_ENV
from shared.model import done_flow
from shared.model.commands import BeadCreate, CrewAdd, CrewHook, CrewRemove, MergeRequestSubmit
from shared.model.crew import CREW_ENV, Crew, crew_publisher, parse_crew_env, shell_tmux_name
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.queries import mayor, witness
from shared.model.results import CrewResult
from shared.model.rigs import home_name

if TYPE_CHECKING:
    from shared.bus.connection import Connection

READY_WAIT_S = 60.0
"""How long `gt crew attach` waits for a member just added to have its workspace."""
SHELL_ENV = ("GT_HOME", "NATS_URL", "GT_TMUX_SOCKET", "PATH")
"""What a crew member's shell takes from the `gt` that opens it (the rest is the tmux server's)."""
AGENT_ENV = ("GT_SESSION", "GT_BEAD", "GT_WORKTREE", "GT_BRANCH", "GT_TOWN_AGENT")
"""Set empty in a crew member's shell: it is a person's, never an agent session's."""


def register(sub: Subcommands) -> None:
    group = sub.group("crew", "crew: a rig's named workspaces, for a person or a hooked bead's agent", "crew_cmd")
    add = group.command("add", _add, help="add a crew member: a workspace on crew/NAME from the rig's base branch")
    remove = group.command(
        "remove", _remove, help="remove a crew member and its workspace (refused while it holds unsaved work)"
    )
    for parser in (add, remove):
        parser.add_argument("rig")
        parser.add_argument("name")
    ls = group.query("list", _list, help="crew members, of one rig when given")
    ls.add_argument("rig", nargs="?")
    attach = group.query(
        "attach", _attach, help="attach to a crew member: its agent's session while one works, else its shell"
    )
    attach.add_argument("rig")
    attach.add_argument("name")


def _line(result: CrewResult) -> str:
    unchanged = "" if result.changed else " (unchanged)"
    where = f", workspace {result.workspace}" if isinstance(result.workspace, str) else ""
    hooked = f", bead {result.hooked} hooked" if isinstance(result.hooked, str) else ""
    return f"crew {result.rig}/{result.name}: {result.status}{unchanged} on {result.branch}{where}{hooked}"


async def _add(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, CrewAdd(rig=args.rig, name=args.name), _line)


async def _remove(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    async def end_shell(result: CrewResult) -> None:
        # Its shell would sit in a folder that is gone (and a member added again would be attached to it).
        tmux = shutil.which("tmux")
        if tmux is not None and result.changed:
            name = f"={shell_tmux_name(args.rig, args.name)}"
            env = {key: os.environ[key] for key in SERVER_ENV if key in os.environ}
            killing = [tmux, "-L", tmux_socket(), "kill-session", "-t", name]
            await asyncio.to_thread(subprocess.run, killing, env=env, capture_output=True)

    return await send(nc, args, config, CrewRemove(rig=args.rig, name=args.name), _line, before_report=end_shell)


async def hook(nc: Connection, args: argparse.Namespace, config: TownConfig, rig: str, name: str, bead: str) -> int:
    """`gt sling BEAD RIG --crew NAME`'s first step: the bead hooked to the member, so its sling runs it there."""
    return await send(nc, args, config, CrewHook(rig=rig, name=name, bead=bead), _line)


def _table(crews: list[Crew]) -> str:
    rows = [
        [
            f"{c.rig}/{c.name}",
            c.status if not c.kept else f"removed, {c.kept}",
            "yes" if c.ready else "not yet",
            c.hooked or "-",
            c.workspace,
        ]
        for c in crews
    ]
    return render.table(["CREW", "STATUS", "WORKSPACE MADE", "HOOKED", "WORKSPACE"], rows, "no crew members")


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    crews = await read_typed(nc, config, witness.CrewList(rig=args.rig))
    return show(args, crews, _table)


async def member(nc: Connection, config: TownConfig, rig: str, name: str) -> Crew:
    for crew in await read_typed(nc, config, witness.CrewList(rig=rig)):
        if crew.name == name and crew.status == "added":
            return crew
    raise UsageError(f"no crew member {rig}/{name} (`gt crew list` shows them; `gt crew add {rig} {name}` adds it)")


async def _attach(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:  # noqa: RET503 - execs
    """Become `tmux attach` on the witness's tmux server: to the session of the agent working the member's hooked
    bead while one is active, else to the member's own shell (opened in its workspace when not there)."""
    tmux = shutil.which("tmux")
    if tmux is None:
        raise UsageError("`gt crew attach` needs tmux on this machine (crew workspaces are where the witness runs)")
    deadline = time.monotonic() + READY_WAIT_S
    crew = await member(nc, config, args.rig, args.name)
    while not crew.ready:  # just added: its workspace is being made
        if time.monotonic() > deadline:
            print(f"gt crew attach: {args.rig}/{args.name}'s workspace is not made yet; try again", file=sys.stderr)
            return EXIT_REJECTED
        await asyncio.sleep(0.2)
        crew = await member(nc, config, args.rig, args.name)
    target = await _agent_session(nc, config, crew) or _shell(tmux, crew)
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}  # attaching from inside tmux too
    os.execve(tmux, [tmux, "-L", tmux_socket(), "attach", "-t", f"={target}"], env)  # noqa: S606 - tmux, as found


async def _agent_session(nc: Connection, config: TownConfig, crew: Crew) -> str | None:
    if crew.hooked is None:
        return None
    sessions = await read_typed(nc, config, witness.Sessions(rig=crew.rig, bead=crew.hooked))
    active = [s for s in sessions if s.status in ACTIVE_SESSION and s.worktree == crew.workspace]
    return active[-1].tmux_name if active else None


def _shell(tmux: str, crew: Crew) -> str:
    """The member's own shell (a person's: ``GT_CREW`` set, no session's variables), opened when not there."""
    name = shell_tmux_name(crew.rig, crew.name)
    # The tmux client gets only ``SERVER_ENV``: when it starts the server, the server's global environment is the
    # client's, readable by every process on the socket (this `gt` may run with a service's passwords).
    client_env = {key: os.environ[key] for key in SERVER_ENV if key in os.environ}
    socket = ["-L", tmux_socket()]
    there = subprocess.run([tmux, *socket, "has-session", "-t", f"={name}"], env=client_env, capture_output=True)
    if there.returncode == 0:
        return name
    refusal = foreign_repository(Path(crew.workspace), os.geteuid())
    if refusal is not None:
        raise UsageError(refusal)
    given = {k: os.environ[k] for k in SHELL_ENV if k in os.environ}
    if "@" in given.get("NATS_URL", ""):
        del given["NATS_URL"]  # a password in it: the session's environment is readable on the socket too
    here = Path(sys.executable).parent
    if (here / "gt").exists():  # the `gt` running now, first: a person's shell runs the same one
        given["PATH"] = os.pathsep.join([str(here), given.get("PATH", os.defpath)])
    env = [f"{CREW_ENV}={crew.rig}/{crew.name}", *(f"{k}={v}" for k, v in given.items())]
    env += [f"{k}=" for k in AGENT_ENV]
    options = [opt for pair in (("-e", e) for e in env) for opt in pair]
    # Not a login shell: a profile's PATH would hide that `gt`.
    shell = 'exec "${SHELL:-/bin/sh}"'
    opened = [tmux, *socket, "new-session", "-d", "-s", name, "-c", crew.workspace, *options, shell]
    subprocess.run(opened, env=client_env, check=True)
    return name


def foreign_repository(workspace: Path, euid: int) -> str | None:
    """Why a person (user ``euid``) must not work in ``workspace`` as it is: its repository belongs to another user,
    an agent that worked a hooked bead there (``GT_AGENT_USER``), whose git config and hooks would run as this
    person at their next git command. None: it is theirs."""
    try:
        owner = (workspace / ".git").lstat().st_uid
    except OSError:
        return None
    if owner == euid:
        return None
    return (
        f"the repository in {workspace} belongs to user {owner}, not you ({euid}): an agent worked a bead there, and "
        "its git config and hooks would run as you. Look at its work as that user, or remove the crew member "
        "(`gt crew remove`) and add it again for a fresh workspace"
    )


# ---- inside a crew member's shell: `gt prime` and `gt done` ------------------------------------------


def crew_of_env() -> tuple[str, str] | None:
    """The crew member whose shell this is (``GT_CREW``), when not inside an agent's session."""
    if os.environ.get("GT_SESSION"):
        return None
    return parse_crew_env(os.environ.get(CREW_ENV, ""))


async def prime(nc: Connection, args: argparse.Namespace, config: TownConfig, rig: str, name: str) -> int:
    crew = await member(nc, config, rig, name)
    lines = [
        f"Crew member {rig}/{name}: workspace {crew.workspace} on {crew.branch}.",
        "Commit your work there and run `gt done` to submit the branch to the rig's merge queue.",
    ]
    if crew.hooked is not None:
        molecule = await read_typed(nc, config, mayor.Molecule(bead=crew.hooked))
        lines += [f"Hooked: bead {crew.hooked}; its agent's sessions work it here.", render.molecule_status(molecule)]
    if args.json:
        render.print_json({"crew": crew, "text": "\n".join(lines)})
    else:
        print("\n".join(lines))
    return EXIT_OK


async def done(nc: Connection, args: argparse.Namespace, config: TownConfig, rig: str, name: str) -> int:
    """A person's `gt done` in a crew workspace: the branch published as a bundle (as a polecat's), a bead filed for
    it (named by its newest commit), and a merge request submitted for that bead. Each step's id is fixed by the
    head, so running it again after a failure resends the same commands."""
    crew = await member(nc, config, rig, name)
    if crew.hooked is not None:
        hooked = await read_typed(nc, config, mayor.Get(id=crew.hooked))
        if hooked.status != "closed":
            # Its agent's commits are on the branch: they go through its own `gt done`, past its molecule's gates.
            raise UsageError(
                f"bead {crew.hooked} is hooked here and open: its agent's session submits the branch (`gt done` "
                "there), past its molecule's gates; submit yours once it is closed"
            )
    if (refusal := foreign_repository(Path(crew.workspace), os.geteuid())) is not None:
        raise UsageError(refusal)
    rig_view = await read_typed(nc, config, witness.Rig(name=rig))
    workspace, base = Path(crew.workspace), rig_view.base_branch
    state = git.worktree_state(workspace, base)
    if not state.exists:
        raise UsageError(f"the workspace {workspace} is not there; nothing to submit")
    if state.branch != crew.branch:
        raise UsageError(f"the workspace is on {state.branch!r}, not the crew member's branch {crew.branch!r}")
    if state.dirty:
        print(dirty_refusal(workspace, state.changes), file=sys.stderr)
        return EXIT_REJECTED
    ahead = git.git("rev-list", "--count", f"refs/remotes/origin/{base}..HEAD", cwd=workspace, check=False).strip()
    if ahead == "0":
        raise UsageError(f"{crew.branch} has no commits that {base} has not: commit your work first")
    head = git.git("rev-parse", "HEAD", cwd=workspace).strip()
    subject = git.git("log", "-1", "--format=%s", "HEAD", cwd=workspace).strip() or f"work on {crew.branch}"
    key = f"crew-{rig}-{name}-{head[:12]}"
    try:
        filed = BeadCreate(title=f"{crew.branch}: {subject}"[:200], type="task", cmd_id=f"{key}-bead")
        bead = await done_step(nc, config, client.with_ids(filed))
        if bead is None:
            print("gt done: the mayor is down; the branch's bead is stored, not filed: run it again", file=sys.stderr)
            return EXIT_REJECTED
        folder = done_flow.published_dir(Path(config.gt_home) / "rigs" / home_name(rig_view), crew_publisher(name))
        published = git.publish(workspace, crew.branch, base, folder)
        submit = MergeRequestSubmit(
            bead=bead.id, rig=rig, branch=crew.branch, head=published.head, bundle=str(published.bundle), cmd_id=key
        )
        mr = await done_step(nc, config, submit)
    except (DoneError, git.GitError) as exc:
        return failed(exc, crew.branch)
    summary: dict[str, str | None] = {"crew": f"{rig}/{name}", "bead": bead.id, "branch": crew.branch}
    summary |= {"head": published.head, "merge_request": mr.id if mr is not None else None}
    line = f"done: {crew.branch} published at {published.head[:10]} for bead {bead.id}, {{queued}} queued"
    return reported(args.json, summary, line)
