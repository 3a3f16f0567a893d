"""Rig, session and nudge commands (owned by the witness) and merge request commands (the refinery's)."""

from __future__ import annotations

import hashlib
import re
from typing import Any, ClassVar

from shared.core.ids import PREFIX_PATTERN
from shared.model.commands.base import (
    MAX_DESCRIPTION,
    MAX_TITLE,
    Command,
    ScopeRef,
    check_id,
    check_priority,
    check_text,
    check_typeable,
    invalid,
)
from shared.model.results import MergeQueueResult, MrResult, NudgeResult, RigResult, SessionResult, StaleHookResult

MAX_COMMAND_LINE = 4096
MAX_POLECATS = 1000
MAX_RESPAWNS = 100
HEX_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
POLECAT_TARGET = re.compile(r"^(?P<rig>[a-z0-9][a-z0-9_-]{0,63})/(?P<polecat>[a-z0-9][a-z0-9_-]{0,63})$")
DEFAULT_AGENT_COMMAND = "gt-agent"
DEFAULT_GIT_NAME = "{rig}/{polecat}"
"""A polecat's git author and committer name when its rig sets none (``demo/ace``)."""
DEFAULT_GIT_EMAIL = "{polecat}.{rig}@gastown.invalid"
"""A polecat's git email when its rig sets none (``ace.demo@gastown.invalid``; ``.invalid`` is never delivered)."""
MAX_GIT_IDENTITY = 200
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
_BRANCH = re.compile(r"[A-Za-z0-9._/-]{1,200}")
"""Control characters but tab: typed into a pane, ``\x03`` interrupts the agent and ``\x1b`` starts a key."""


def check_branch(field: str, value: str | None) -> None:
    """A branch name git takes as one, and never as an option: no leading ``-`` (``--upload-pack=...``)."""
    if value is None:
        return
    if (
        not _BRANCH.fullmatch(value)
        or value.startswith(("-", "/", "."))
        or value.endswith(("/", ".", ".lock"))
        or any(bad in value for bad in ("..", "//", "/.", "@{"))
    ):
        raise invalid(
            f"`{field}` {value[:80]!r} is not a branch name (letters, digits, '.', '_', '-' and '/'; "
            "not starting with '-', '/' or '.', no '..')"
        )


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_GATE_ENV = 64
TOWN_ENV = re.compile(r"^GT_|NATS_")
"""The town's settings and credentials (``GT_*``, ``NATS_*``, ``REFINERY_NATS_PASSWORD``): never a gate's."""
_GIT_PLACEHOLDERS = frozenset({"{rig}", "{polecat}"})


def mr_id_for(rig: str, bead: str, head: str, incarnation: int = 1) -> str:
    """A merge request belongs to its bead: the same commit submitted twice for one bead is one merge request,
    the same commit submitted for two beads is two (each bead is settled by its own), and for a rig added again
    after its removal (a later ``incarnation``) it is another."""
    key = rig if incarnation == 1 else f"{rig}.{incarnation}"
    return "mr-" + hashlib.blake2b(f"{key}:{bead}:{head}".encode()).hexdigest()[:12]


def git_identity(name_template: str, email_template: str, *, rig: str, polecat: str) -> tuple[str, str]:
    """The git name and email a polecat of ``rig`` commits with: the rig's templates (empty: the defaults)
    with ``{rig}`` and ``{polecat}`` filled in."""

    def fill(template: str) -> str:
        return template.replace("{rig}", rig).replace("{polecat}", polecat)

    return fill(name_template or DEFAULT_GIT_NAME), fill(email_template or DEFAULT_GIT_EMAIL)


def check_git_template(field: str, template: str) -> None:
    """A template git can use as a name or an email: one line, no ``<`` or ``>`` (git's own delimiters), only
    the placeholders ``{rig}`` and ``{polecat}``."""
    check_text(field, template, MAX_GIT_IDENTITY)
    if any(c in template for c in "\n\r\0"):
        raise invalid(f"`{field}` must be one line")
    if "<" in template or ">" in template:
        raise invalid(f"`{field}` {template[:80]!r} must not contain < or > (git puts the email between them)")
    unknown = sorted(set(_PLACEHOLDER.findall(template)) - _GIT_PLACEHOLDERS)
    if unknown:
        raise invalid(
            f"`{field}` {template[:80]!r} names {', '.join(unknown)}: only {{rig}} and {{polecat}} are filled in"
        )


RIG_SETTINGS = (
    "setup_command",
    "lint_command",
    "test_command",
    "agent_command",
    "max_polecats",
    "max_respawns",
    "stall_after_s",
    "git_name",
    "git_email",
    "gate_env",
    "gate_pristine",
)
"""A rig's settings: given by ``rig.add``, changed in place by ``rig.update`` (``rig.updated`` carries them)."""


def check_rig_settings(cmd: object) -> None:
    """The rig settings ``cmd`` gives (None: not given), each in its range: one rule for add and update."""

    def given(field: str) -> Any:
        return getattr(cmd, field)

    for field in ("setup_command", "lint_command", "test_command"):
        check_text(field, given(field), MAX_COMMAND_LINE)
    check_text("agent_command", given("agent_command"), MAX_COMMAND_LINE, nonblank=True)
    if (polecats := given("max_polecats")) is not None and not 1 <= polecats <= MAX_POLECATS:
        raise invalid(f"`max_polecats` must be 1-{MAX_POLECATS}, got {polecats}")
    if (respawns := given("max_respawns")) is not None and not 0 <= respawns <= MAX_RESPAWNS:
        raise invalid(f"`max_respawns` must be 0-{MAX_RESPAWNS}, got {respawns}")
    if (stall := given("stall_after_s")) is not None and not stall > 0:
        raise invalid(f"`stall_after_s` must be positive, got {stall}")
    for field in ("git_name", "git_email"):
        if (template := given(field)) is not None:
            check_git_template(field, template)
    check_gate_env(given("gate_env"))


def check_gate_env(names: list[str] | None) -> None:
    """Names of the refinery's environment variables a rig's gates may see besides the allowlist: variable names,
    never the town's own settings or credentials."""
    if names is None:
        return
    if len(names) > MAX_GATE_ENV:
        raise invalid(f"`gate_env` names at most {MAX_GATE_ENV} variables, got {len(names)}")
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise invalid(f"`gate_env` {name[:80]!r} is not an environment variable name")
        if TOWN_ENV.search(name.upper()):
            raise invalid(
                f"`gate_env` may not name {name}: the town's settings and NATS credentials never reach a gate "
                "(it runs code an agent wrote)"
            )


class RigAdd(Command[RigResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Add a project: the witness clones ``repo`` under GT_HOME and runs polecats in worktrees of it."""

    SUBJECT: ClassVar[str] = "gt.cmd.rig.add"
    OWNER: ClassVar[str] = "witness"
    ORDERED_BY = ("rig", "name")
    REQUIRED_IDS = ("name",)
    name: str
    repo: str
    """A path or URL git can clone."""
    base_branch: str = "main"
    prefix: str | None = None
    """Bead id prefix for the rig's beads (default: the name, without dashes)."""
    setup_command: str = ""
    lint_command: str = ""
    test_command: str = ""
    agent_command: str = DEFAULT_AGENT_COMMAND
    """Run (through ``sh -c``) in each polecat's worktree; ``{beacon}`` is replaced by the startup prompt."""
    max_polecats: int = 4
    max_respawns: int = 3
    """A bead whose sessions died more often than this is escalated instead of respawned."""
    stall_after_s: float = 600.0
    """A session with no heartbeat and no step progress for this long is stalled."""
    git_name: str = ""
    """Git author and committer name of the rig's polecats; ``{rig}`` and ``{polecat}`` are filled in.
    Empty: ``{rig}/{polecat}``."""
    git_email: str = ""
    """Git author and committer email of the rig's polecats, a template like ``git_name``.
    Empty: ``{polecat}.{rig}@gastown.invalid``."""
    gate_env: list[str] = []
    """Names of the refinery's environment variables its gates see besides PATH, HOME, LANG, LC_ALL, TMPDIR,
    USER and LOGNAME (``GATE_BASE_ENV``): gates run code an agent wrote and get nothing else of it."""
    gate_pristine: bool = False
    """The gates of each merge run in a workspace made fresh for it (no build output, caches or gate home kept from
    an earlier merge): slower, and nothing one change's gate leaves can affect a later change's gate. False
    (default): the rig's gate workspace is persistent and its ignored files (build caches, installed dependencies)
    and the gate's home survive between merges."""

    def validate(self) -> None:
        super().validate()
        check_text("repo", self.repo, MAX_COMMAND_LINE, nonblank=True)
        if self.repo.startswith("-"):
            raise invalid(f"`repo` {self.repo[:80]!r} must not start with '-' (git would take it for an option)")
        check_branch("base_branch", self.base_branch)
        if self.prefix is not None and not PREFIX_PATTERN.fullmatch(self.prefix):
            raise invalid(f"`prefix` {self.prefix!r} must match {PREFIX_PATTERN.pattern}")
        check_rig_settings(self)

    def rig_prefix(self) -> str:
        return self.prefix or re.sub(r"[^a-z0-9_]", "", self.name)[:16] or "rig"

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("rig", self.name)


class RigUpdate(Command[RigResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Change some of a rig's settings (the fields given); its name, repository, base branch and prefix stay.
    Sessions already running keep what they started with; new sessions and merges take the new values."""

    SUBJECT: ClassVar[str] = "gt.cmd.rig.update"
    OWNER: ClassVar[str] = "witness"
    ORDERED_BY = ("rig", "name")
    REQUIRED_IDS = ("name",)
    name: str
    setup_command: str | None = None
    lint_command: str | None = None
    test_command: str | None = None
    agent_command: str | None = None
    max_polecats: int | None = None
    max_respawns: int | None = None
    stall_after_s: float | None = None
    git_name: str | None = None
    git_email: str | None = None
    gate_env: list[str] | None = None
    gate_pristine: bool | None = None

    SETTINGS: ClassVar[tuple[str, ...]] = RIG_SETTINGS

    def validate(self) -> None:
        super().validate()
        check_rig_settings(self)
        if all(getattr(self, field) is None for field in self.SETTINGS):
            raise invalid(f"name at least one setting to change ({', '.join(self.SETTINGS)})")

    def given(self) -> dict[str, str | int | float | bool | list[str]]:
        """The settings the command changes, by field name."""
        return {field: value for field in self.SETTINGS if (value := getattr(self, field)) is not None}

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("rig", self.name)


class _RigCommand(Command[RigResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    ORDERED_BY = ("rig", "name")
    REQUIRED_IDS = ("name",)
    name: str

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("rig", self.name)


class RigPark(_RigCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start no new sessions on the rig: running ones finish, slings to it are accepted and wait, its merge
    queue goes on."""

    SUBJECT: ClassVar[str] = "gt.cmd.rig.park"
    OWNER: ClassVar[str] = "witness"
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        check_text("reason", self.reason, MAX_DESCRIPTION)


class RigUnpark(_RigCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start sessions on a parked rig again."""

    SUBJECT: ClassVar[str] = "gt.cmd.rig.unpark"
    OWNER: ClassVar[str] = "witness"


class RigRemove(_RigCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Take the rig out of service for good: refused while beads are hooked to it unless ``force``; then it is
    parked for good (running sessions finish), hidden from ``gt rig list``, and slings to it are refused."""

    SUBJECT: ClassVar[str] = "gt.cmd.rig.remove"
    OWNER: ClassVar[str] = "witness"
    force: bool = False


class _SessionCommand(Command[SessionResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    ORDERED_BY = ("session", "session")
    REQUIRED_IDS = ("session",)
    session: str

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("session", self.session)


class SessionDoneIntentCmd(_SessionCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``gt done`` begins: written first, so a death from here on is finished, not re-run."""

    SUBJECT: ClassVar[str] = "gt.cmd.session.done_intent"
    OWNER: ClassVar[str] = "witness"


class SessionFinish(_SessionCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``gt done`` finished (branch pushed, merge request submitted): the session ends."""

    SUBJECT: ClassVar[str] = "gt.cmd.session.finish"
    OWNER: ClassVar[str] = "witness"


class SessionHandoff(_SessionCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """End this session and start a fresh one on the same hook (same bead, same worktree)."""

    SUBJECT: ClassVar[str] = "gt.cmd.session.handoff"
    OWNER: ClassVar[str] = "witness"
    note: str = ""

    def validate(self) -> None:
        super().validate()
        check_text("note", self.note, MAX_DESCRIPTION)


class SessionStop(_SessionCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """(the operator) Stop a running session cleanly: the witness warrants it (``stopped``), kills its agent
    and records it ended; no death, the bead keeps its hook and progress (``gt down --sessions``)."""

    SUBJECT: ClassVar[str] = "gt.cmd.session.stop"
    OWNER: ClassVar[str] = "witness"


class SessionRecoverHook(Command[StaleHookResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """(the deacon) A working bead's hook lease lapsed ``token`` and nothing took it since: the witness re-slings
    the bead (its last worktree is clean) or escalates it (dirty or unpushed work, a rejected merge request, or
    recovered before), or answers that it is not stale after all."""

    SUBJECT: ClassVar[str] = "gt.cmd.session.recover_hook"
    OWNER: ClassVar[str] = "witness"
    ORDERED_BY = ("hook", "bead")
    REQUIRED_IDS = ("bead",)
    bead: str
    token: int

    def validate(self) -> None:
        super().validate()
        if self.token < 1:
            raise invalid(f"`token` must be at least 1, got {self.token}")

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("bead", self.bead)


class NudgeSend(Command[NudgeResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Type a message into an agent's pane: ``target`` is a session id or ``<rig>/<polecat>``."""

    SUBJECT: ClassVar[str] = "gt.cmd.nudge.send"
    OWNER: ClassVar[str] = "witness"
    target: str
    message: str
    ttl_s: float = 1800.0
    """Queued this long at most while the session is starting or gone."""

    def validate(self) -> None:
        super().validate()
        check_text("target", self.target, 130, nonblank=True)
        check_text("message", self.message, MAX_TITLE * 8, nonblank=True)
        check_typeable("message", self.message)
        if not 0 < self.ttl_s <= 7 * 24 * 3600:
            raise invalid(f"`ttl_s` must be more than 0 and at most a week, got {self.ttl_s}")

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("target", self.target)


class MergeRequestSubmit(Command[MrResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Queue a pushed branch for the rig's refinery; the same head commit twice is one merge request.

    Sent by a polecat session (``session`` given, or a ``polecat:`` actor, or a ``fence``): it must carry the
    bead's hook lease as its ``fence``, its session must hold it, its branch be the session's and its target the
    rig's base branch. Sent by hand (none of these): its branch must not be the target or a protected name.
    Agents send ``gt.cmd.mr.done`` (``MergeRequestDone``); this subject is the operator's."""

    SUBJECT: ClassVar[str] = "gt.cmd.mr.submit"
    OWNER: ClassVar[str] = "refinery"
    REQUIRED_IDS: ClassVar[tuple[str, ...]] = ("bead", "rig")
    bead: str
    rig: str
    branch: str
    head: str
    target: str | None = None
    """Branch to merge into (default: the rig's base branch)."""
    priority: int = 2
    session: str | None = None
    bundle: str | None = None
    """Where `gt done` published the branch's commits (a git bundle's absolute path, for the refinery to import:
    ``shared.host.git.publish``); None: the branch is in the rig's repository (a merge request submitted by hand)."""

    def validate(self) -> None:
        super().validate()
        check_branch("branch", self.branch)
        if not HEX_COMMIT.fullmatch(self.head):
            raise invalid(f"`head` {self.head[:80]!r} is not a commit id (hex)")
        if self.bundle is not None and (
            not self.bundle.startswith("/")
            or not self.bundle.endswith(".bundle")
            or len(self.bundle) > 4096
            or "/../" in self.bundle
            or any(ord(c) < 32 for c in self.bundle)
        ):
            raise invalid("`bundle` must be the absolute path of a .bundle file (gt done writes it)")
        check_branch("target", self.target)
        check_priority(self.priority)
        check_id("session", self.session)

    def ordering_key(self) -> str | None:
        return f"mr:{mr_id_for(self.rig, self.bead, self.head)}"


class MergeRequestDone(MergeRequestSubmit, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A polecat session's merge request (``gt done``, or the witness finishing it): ``session`` and the hook
    lease ``fence`` are required. The only merge request subject the agent NATS user may publish."""

    SUBJECT: ClassVar[str] = "gt.cmd.mr.done"
    OWNER: ClassVar[str] = "refinery"
    REQUIRED_IDS = (*MergeRequestSubmit.REQUIRED_IDS, "session")

    def worked_bead(self) -> str | None:
        return self.bead


class MergeRequestRetry(Command[MrResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Put a failed, conflicted or rejected merge request back in the queue."""

    SUBJECT: ClassVar[str] = "gt.cmd.mr.retry"
    OWNER: ClassVar[str] = "refinery"
    ORDERED_BY = ("mr", "id")
    REQUIRED_IDS = ("id",)
    id: str


class MergeRequestReject(Command[MrResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Take a merge request out of the queue for good."""

    SUBJECT: ClassVar[str] = "gt.cmd.mr.reject"
    OWNER: ClassVar[str] = "refinery"
    ORDERED_BY = ("mr", "id")
    REQUIRED_IDS = ("id",)
    id: str
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        check_text("reason", self.reason, MAX_DESCRIPTION)


class MergeQueueResume(Command[MergeQueueResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resume a rig's paused merge queue (the cause fixed): it goes on in its order. Not paused: no change."""

    SUBJECT: ClassVar[str] = "gt.cmd.mq.resume"
    OWNER: ClassVar[str] = "refinery"
    ORDERED_BY = ("mq", "rig")
    REQUIRED_IDS = ("rig",)
    rig: str


RIG_COMMANDS: tuple[type[Command], ...] = (
    RigAdd,
    RigUpdate,
    RigPark,
    RigUnpark,
    RigRemove,
    SessionDoneIntentCmd,
    SessionFinish,
    SessionHandoff,
    SessionStop,
    SessionRecoverHook,
    NudgeSend,
    MergeRequestSubmit,
    MergeRequestDone,
    MergeRequestRetry,
    MergeRequestReject,
    MergeQueueResume,
)
