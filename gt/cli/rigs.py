"""`gt rig add|list|show|update|remove|park|unpark` (the witness's) and `gt unsling` (the mayor's): add a project,
change it in place, take it out of service, and give a bead's hook back."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from gt.cli import render
from gt.cli.common import Subcommands, UsageError, read, send, show_reply
from shared.bus.query import ask
from shared.core.arguments import from_args, yes_no
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.host import git
from shared.model.commands import BeadUnsling, RigAdd, RigPark, RigRemove, RigUnpark, RigUpdate
from shared.model.queries import witness
from shared.model.results import RigResult, SlingResult
from shared.model.rigs import RigView

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def env_names(text: str) -> list[str]:
    """``--gate-env CI_CACHE,PIP_INDEX_URL``: the names, comma-separated ("" for none)."""
    return [name.strip() for name in text.split(",") if name.strip()]


GATE_ENV_HELP = "environment variables of the refinery its gates see besides PATH, HOME, LANG... (comma-separated)"
GATE_PRISTINE_HELP = (
    "gate each merge in a workspace made fresh for it (no build output, caches or gate home kept from an earlier "
    "merge): slower, and nothing one change's gate leaves can affect a later change's gate"
)

SETTING_OPTIONS = (
    ("--setup", "setup_command", str, 'gate: set-up command ("" for none)'),
    ("--lint", "lint_command", str, 'gate: lint command ("" for none)'),
    ("--test", "test_command", str, 'gate: test command ("" for none)'),
    (
        "--agent",
        "agent_command",
        str,
        "agent runtime (claude, codex, gemini, gt-agent) or a command run in each polecat's worktree; running "
        "sessions keep theirs",
    ),
    ("--max-polecats", "max_polecats", int, "sessions the rig runs at once"),
    ("--max-respawns", "max_respawns", int, "deaths of a bead before it is escalated instead of respawned"),
    ("--stall-after", "stall_after_s", float, "seconds without heartbeat or progress before a session is stalled"),
    (
        "--git-name",
        "git_name",
        str,
        'git name template of new sessions ({rig}, {polecat}; "": default)',
    ),
    ("--git-email", "git_email", str, 'git email template of new sessions ({rig}, {polecat}; "": default)'),
    ("--gate-env", "gate_env", env_names, GATE_ENV_HELP + ' ("" for none)'),
    (
        "--gate-pristine",
        "gate_pristine",
        yes_no,
        "yes: " + GATE_PRISTINE_HELP + "; no: the rig's gate workspace, its ignored files and the gate's home persist",
    ),
)
"""(option, command field, type, help) of `gt rig update`."""


def register(sub: Subcommands) -> None:
    rig = sub.group("rig", "rigs (projects): add, list, show, update, remove, park, unpark", "rig_cmd")
    ra = rig.command(
        "add",
        _rig_add,
        help="add a project: the witness clones it and runs polecats in worktrees of it",
        precheck=_absolute_repo,
    )
    ra.add_argument("name")
    ra.add_argument("repo", help="path or URL git can clone (a path is made absolute)")
    ra.add_argument("--base-branch", default="main")
    ra.add_argument(
        "--prefix",
        help="id prefix of the rig's own beads: those filed with `gt bead create --rig NAME`, by its refinery "
        "(merge conflicts, a broken target) and by automations for it (default: the name); a bead keeps the id "
        "it was created with wherever it is slung",
    )
    ra.add_argument("--setup", default="", help="gate: set-up command")
    ra.add_argument("--lint", default="", help="gate: lint command")
    ra.add_argument("--test", default="", help="gate: test command")
    ra.add_argument(
        "--agent",
        default=None,
        help="the polecats' runtime: `claude` (Claude Code: ANTHROPIC_* and GT_CLAUDE_BIN from `gt up`'s "
        "environment), `codex` (Codex CLI: OPENAI_API_KEY, OPENAI_BASE_URL, GT_CODEX_BIN), `gemini` (Gemini CLI: "
        "GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL, GT_GEMINI_BIN); the witness writes each one's settings and hooks. "
        "`gt-agent` (the reference agent, the default), or any other command line, run in each polecat's "
        "worktree with GT_* variables naming its bead (docs/agents.md)",
    )
    ra.add_argument("--max-polecats", type=int, default=None)
    ra.add_argument("--max-respawns", type=int, default=None)
    ra.add_argument("--stall-after", type=float, default=None, help="seconds without heartbeat or progress")
    ra.add_argument(
        "--git-name",
        default=None,
        help="git name its polecats commit with; {rig} and {polecat} are filled in (default {rig}/{polecat})",
    )
    ra.add_argument(
        "--git-email",
        default=None,
        help="git email its polecats commit with, a template like --git-name (default {polecat}.{rig}@gastown.invalid)",
    )
    ra.add_argument("--gate-env", type=env_names, default=None, metavar="NAMES", help=GATE_ENV_HELP)
    ra.add_argument("--gate-pristine", action="store_true", help=GATE_PRISTINE_HELP)
    rig.query("list", _rig_list, help="rigs with their active sessions and waiting beads")
    rs = rig.query("show", _rig_show, help="one rig's configuration")
    rs.add_argument("name")
    register_rig_verbs(rig)


def _absolute_repo(args: argparse.Namespace) -> None:
    """A local repository is named by its absolute path: the witness resolves nothing against our cwd. An empty
    argument is refused, not taken for the current directory (``Path("")`` is ``.``)."""
    repo = args.repo
    if not repo.strip():
        raise UsageError(
            "the repository argument is empty: name a path or URL git can clone (`.` for the current directory)"
        )
    if "://" not in repo and not repo.startswith("git@") and Path(repo).exists():
        args.repo = str(Path(repo).resolve())


async def _rig_add(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = from_args(
        RigAdd,
        args,
        setup_command=args.setup,
        lint_command=args.lint,
        test_command=args.test,
        agent_command=args.agent,
        stall_after_s=args.stall_after,
    )
    return await send(nc, args, config, cmd, _rig_added_line)


def _rig_added_line(result: RigResult) -> str:
    line = _rig_line(result)
    repo, base = result.repo or "", result.base_branch or None
    if git.is_checkout(repo):
        # What merges do to a laptop checkout (docs/operating.md): said once, where the rig is added.
        line += (
            f"\nnote: {repo} is a checkout (not bare): a merge into {base} updates its work tree when {base} is "
            "checked out there and clean, and is refused and escalated while it has uncommitted changes"
        )
    return line


def _rig_line(result: RigResult) -> str:
    changed = "" if result.changed else " (unchanged)"
    where = f"{result.repo or None} ({result.base_branch or None})"
    return f"rig {result.rig or None}: {where}, prefix {result.prefix or None}{changed}"


async def _rig_list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = witness.Rigs()
    return show_reply(args, query, await read(nc, config, query), _rig_table)


def _rig_table(rigs: list[RigView]) -> str:
    rows = [
        [
            r.name,
            r.repo,
            r.base_branch,
            "parked" if r.parked else "active",
            f"{r.active_sessions}/{r.max_polecats}",
            str(r.waiting_beads),
        ]
        for r in rigs
    ]
    headers = ("RIG", "REPO", "BASE", "STATE", "SESSIONS", "WAITING")
    return render.table(headers, rows, "no rigs (gt rig add NAME REPO)")


async def _rig_show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = witness.Rig(name=args.name)
    return show_reply(args, query, await read(nc, config, query), render.rig_detail)


def register_rig_verbs(rig: Subcommands) -> None:
    """`gt rig update|remove|park|unpark` beside `gt rig add|list|show`."""
    ru = rig.command("update", _rig_update, help="change a rig's agent, gates or limits (new sessions take them)")
    ru.add_argument("name")
    for option, field, kind, text in SETTING_OPTIONS:
        metavar = "yes|no" if kind is yes_no else None
        ru.add_argument(option, dest=field, type=kind, default=None, metavar=metavar, help=text)
    rr = rig.command(
        "remove", _rig_remove, help="take a rig out of service (refused while work is hooked, unless --force)"
    )
    rr.add_argument("name")
    rr.add_argument("--force", action="store_true", help="remove it anyway: parked for good, running sessions finish")
    rp = rig.command("park", _rig_park, help="start no new sessions on a rig (slings wait, running sessions finish)")
    rp.add_argument("name")
    rp.add_argument("--reason", default="")
    rn = rig.command("unpark", _rig_unpark, help="start sessions on a parked rig again")
    rn.add_argument("name")


def register_unsling(sub: Subcommands) -> None:
    un = sub.command("unsling", _unsling, help="give a bead's hook back: open again, its session ended, its steps kept")
    un.add_argument("bead")
    un.add_argument("--reason", default="")
    un.add_argument(
        "--remove-worktree",
        action="store_true",
        help="remove its worktree too (kept anyway if it holds uncommitted or unpushed work)",
    )


def _value(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


UPDATE_TAKES_EFFECT = (
    (
        frozenset({"max_polecats", "max_respawns", "stall_after_s"}),
        "from the witness's next patrol, running sessions included",
    ),
    (frozenset({"lint_command", "test_command", "gate_env", "gate_pristine"}), "at the refinery's next merge"),
    (
        frozenset({"agent_command", "setup_command", "git_name", "git_email"}),
        "in new sessions (running ones keep what they started with)",
    ),
)
"""When each setting ``gt rig update`` changes takes effect (docs/operating.md, ``gt.cmd.rig.update``)."""


def _new_value(result: RigResult, field: str) -> Any:
    """The setting's new value as the result carries it: an empty one (``gate_env=[]``, ``setup_command=''``) is
    a value, only one the result leaves out is None."""
    value = getattr(result, field, UNSET)
    return None if value is UNSET else value


def _update_line(result: RigResult) -> str:
    if not result.changed:
        return f"rig {result.rig or None}: unchanged"
    fields = list(result.fields or [])
    # ``fields`` names the settings that changed; the result carries each one's new value under its name.
    changes = ", ".join(f"{field}={_value(_new_value(result, field))}" for field in fields)
    when = [
        f"{', '.join(f for f in fields if f in group)} {effect}"
        for group, effect in UPDATE_TAKES_EFFECT
        if any(f in group for f in fields)
    ]
    return f"rig {result.rig or None} updated: {changes} ({'; '.join(when)})"


async def _rig_update(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = from_args(RigUpdate, args)
    return await send(nc, args, config, cmd, _update_line)


def _remove_line(result: RigResult) -> str:
    unchanged = "" if result.changed else " (unchanged)"
    hooked = result.hooked or []
    still = f"; still hooked, waiting for `gt unsling`: {', '.join(hooked)}" if hooked else ""
    return f"rig {result.rig or None}: removed{unchanged} (running sessions finish; no new ones){still}"


async def _rig_remove(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, RigRemove(name=args.name, force=args.force), _remove_line)


def park_line(result: RigResult) -> str:
    unchanged = "" if result.changed else " (unchanged)"
    count = result.waiting or 0
    beads = "1 bead" if count == 1 else f"{count} beads"
    rig = result.rig or None
    if result.status == "parked":
        return f"rig {rig}: parked{unchanged}; no new sessions, {beads} waiting"
    if count == 0:
        return f"rig {rig}: active{unchanged}; no bead is waiting"
    gets = "the waiting bead gets a session" if count == 1 else f"the {count} waiting beads get sessions"
    return f"rig {rig}: active{unchanged}; {gets} now"


async def _rig_park(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, RigPark(name=args.name, reason=args.reason), park_line)


async def _rig_unpark(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, RigUnpark(name=args.name), park_line)


async def _working_session(nc: Connection, bead: str) -> str | None:
    """The session working the bead now, as the witness knows it (None: none, or the witness is not there)."""
    try:
        sessions = await ask(nc, witness.Sessions(bead=bead), timeout=5.0)
    except QueryError:
        return None
    return sessions[-1].id if sessions else None


def unsling_line(result: SlingResult, session: str | None, *, remove_worktree: bool) -> str:
    out = f"{result.id}: open (unslung from {result.rig}; its done steps are kept)"
    if session is not None:
        out += f"; the witness ends session {session}"
        if remove_worktree:
            out += " and removes its worktree unless it holds unsaved work"
    elif remove_worktree:
        out += "; the witness removes its worktree unless it holds unsaved work"
    return out


async def _unsling(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    session = await _working_session(nc, args.bead)

    def line(result: SlingResult) -> str:
        return unsling_line(result, session, remove_worktree=args.remove_worktree)

    cmd = BeadUnsling(id=args.bead, reason=args.reason, remove_worktree=args.remove_worktree)
    return await send(nc, args, config, cmd, line)
