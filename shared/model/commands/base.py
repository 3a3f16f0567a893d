"""The command base class and the field checks every command shares.

Parsing never raises anything but ``CommandError`` with one of the reason codes (docs/architecture.md, "Commands:
from a body to events"), so every bad input ends in a ``cmd.rejected`` a person can act on.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, Literal, NamedTuple

import msgspec

from shared.core import terminal
from shared.core.errors import CommandError
from shared.core.ids import BEAD_SUFFIX_LEN, ID_PATTERN, is_new_id, is_valid_id
from shared.model.events.beads import BEAD_TYPES, INFRA_TYPES, WORK_TYPES
from shared.model.results import R

DEFAULT_MAX_COMMAND_BYTES = 1024 * 1024
MAX_TITLE = 500
MAX_DESCRIPTION = 256 * 1024
MAX_LABEL = 128
MAX_ACTOR = 128
MAX_REASON = 4096
MAX_META_KEY = 128
MAX_META_VALUE = 64 * 1024
MAX_LIST = 256
VAR_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class Fence(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A lease the sender holds: the command is refused unless ``token`` is the lease's live token."""

    lease: str
    token: int


class ScopeRef(NamedTuple):
    """What a command names that places it in one rig, as far as the log knows it: a rig by its name, a session,
    a bead, or a nudge's target (a session id or ``<rig>/<polecat>``). A service whose instances split the town by
    rig (the witness) settles a command where the rig it resolves to is served."""

    kind: Literal["rig", "session", "bead", "target"]
    id: str


class Command(msgspec.Struct, Generic[R], frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Fields every command body may carry. ``R`` is what its outcome's ``result`` is read into (``result_type``),
    as ``Query[R]`` names its reply (``shared.model.results``).

    Encoded (``shared.bus.commands``), a command leaves out every field that holds its default: the service reads
    an absent field as its default, so the body says only what the sender chose, as a hand-written one would."""

    SUBJECT: ClassVar[str] = ""
    OWNER: ClassVar[str] = ""
    """The service that settles it: the owner of its aggregate (``gt.cmd.<aggregate>.<verb>``), from which the
    command consumers are laid out (``shared.bus.topology.COMMAND_OWNERS``)."""
    ORDERED_BY: ClassVar[tuple[str, str] | None] = None
    """Its ordering key as (kind, field): ``<kind>:<the field's value>`` (no key while the field is None). None:
    no order needed, or ``ordering_key`` says."""
    REQUIRED_IDS: ClassVar[tuple[str, ...]] = ()
    """Fields naming a record by id that must be given (checked first, after the fields every command has)."""
    cmd_id: str | None = None
    """The command's id when no ``Nats-Msg-Id`` header is given; resending the same id is harmless."""
    actor: str | None = None
    """Who is acting (default ``operator``)."""
    correlation_id: str | None = None
    """Ties the command's events to a larger piece of work."""
    fence: Fence | None = None
    """Sent by a lease holder: refused (``conflict``) once the lease expired or passed to another holder."""

    def validate(self) -> None:
        """Field checks msgspec's types cannot express; raises ``CommandError('invalid', ...)``."""
        check_text("actor", self.actor, MAX_ACTOR, nonblank=True)
        if self.fence is not None:
            check_id("fence.lease", self.fence.lease, required=True)
        for name in self.REQUIRED_IDS:
            check_id(name, getattr(self, name), required=True)

    def ordering_key(self) -> str | None:
        """Commands with the same key are decided one after the other, each on a projection that holds its
        predecessor's events: those on the same aggregate (None: no order needed). A create whose sender chose
        the new id (``new_id``) is keyed by it, so a command on it sent right after is decided after it."""
        if self.ORDERED_BY is None:
            return None
        kind, field = self.ORDERED_BY
        value = getattr(self, field)
        return None if value is None else f"{kind}:{value}"

    def worked_bead(self) -> str | None:
        """The bead it works on as that bead's hook holder (its steps, its claim, its ``gt done`` merge request):
        a polecat session sends it only fenced by that bead's hook lease."""
        return None

    def scope_ref(self) -> ScopeRef | None:
        """What it names that places it in a rig (None: nothing; only a service serving every rig settles it)."""
        return None


class Creates(Command[R], Generic[R], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command that creates something with an id of its own (a bead, a convoy, an escalation, a message)."""

    new_id: str | None = None
    """The id of what it creates, chosen by the sender (``<prefix>-`` and six of ``[0-9a-z]``), so the sender knows
    it before the answer: ``gt`` chooses one, and prints it even while the owning service is down. Refused
    ``conflict`` when it is taken. None: the service draws one."""

    def id_prefix(self) -> str:
        """The prefix of the id of what it creates."""
        raise NotImplementedError

    def validate(self) -> None:
        super().validate()
        if self.new_id is not None and not is_new_id(self.new_id, self.id_prefix()):
            raise invalid(
                f"`new_id` {self.new_id[:80]!r} must be {self.id_prefix()!r}, '-' and {BEAD_SUFFIX_LEN} of "
                "[0-9a-z] (or left out: the service draws one)"
            )


def result_type(cls: type[Command[Any]]) -> Any:
    """``R`` of ``cls`` (``Command[R]``, perhaps through ``Creates[R]``), what its outcome's result is read into;
    ``Any`` (the JSON as it came) for a command that names none."""
    return _result_types.get(cls) or _result_types.setdefault(cls, _find_result_type(cls))


_result_types: dict[type[Any], Any] = {}


def _find_result_type(cls: type[Any]) -> Any:
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Command):
                (arg,) = typing.get_args(base)
                if not isinstance(arg, typing.TypeVar):
                    return arg
    return Any


def invalid(message: str) -> CommandError:
    return CommandError("invalid", message)


def check_id(field: str, value: str | None, *, required: bool = False) -> None:
    if value is None:
        if required:
            raise invalid(f"`{field}` is required")
        return
    if not is_valid_id(value):
        raise invalid(
            f"`{field}` {value[:80]!r} is not a valid id: it must match {ID_PATTERN.pattern} "
            "(lowercase letters, digits, '_' and '-'; no dots, spaces or wildcards)"
        )


def check_ids(field: str, values: list[str], *, required: bool = False) -> None:
    if required and not values:
        raise invalid(f"`{field}` must name at least one id")
    if len(values) > MAX_LIST:
        raise invalid(f"`{field}` has {len(values)} entries; the limit is {MAX_LIST}")
    for value in values:
        check_id(field, value)


def check_text(field: str, value: str | None, limit: int, *, nonblank: bool = False) -> None:
    """``value`` (None: not given) is at most ``limit`` characters, and not blank when ``nonblank``."""
    if value is None:
        return
    if nonblank and not value.strip():
        raise invalid(f"`{field}` must not be empty")
    if len(value) > limit:
        raise invalid(f"`{field}` is {len(value)} characters; the limit is {limit}")


def check_typeable(field: str, value: str) -> None:
    """``value`` is one line with no control character: it is typed into an agent's pane and sent with Enter (a
    newline would send part of it, a control character act as a key)."""
    if "\n" in value or "\r" in value:
        raise invalid(f"`{field}` must be one line (it is typed into the pane and sent with Enter)")
    if terminal.CONTROL_BUT_TAB.search(value):
        raise invalid(f"`{field}` must not hold control characters (typed into the pane, they act as keys)")


def check_type(value: str) -> None:
    if value not in BEAD_TYPES:
        work, plumbing = ", ".join(WORK_TYPES), ", ".join(sorted(INFRA_TYPES))
        raise invalid(f"`type` {value[:80]!r} is no bead type; work: {work}; plumbing: {plumbing}")


def check_labels(field: str, labels: list[str]) -> None:
    if len(labels) > MAX_LIST:
        raise invalid(f"`{field}` has {len(labels)} entries; the limit is {MAX_LIST}")
    for label in labels:
        if not label.strip() or len(label) > MAX_LABEL:
            raise invalid(f"`{field}` has an empty or over-long label {label[:40]!r} (1-{MAX_LABEL} characters)")


def check_metadata(field: str, metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_LIST:
        raise invalid(f"`{field}` has {len(metadata)} keys; the limit is {MAX_LIST}")
    for key, value in metadata.items():
        if not key.strip() or len(key) > MAX_META_KEY:
            raise invalid(f"`{field}` key {key[:40]!r} must be 1-{MAX_META_KEY} characters")
        if len(value) > MAX_META_VALUE:
            raise invalid(f"`{field}` value of {key!r} is over {MAX_META_VALUE} characters")


def check_vars(field: str, values: dict[str, str]) -> None:
    check_metadata(field, values)
    for name in values:
        if not VAR_NAME_PATTERN.fullmatch(name):
            raise invalid(f"`{field}` name {name[:40]!r} must match {VAR_NAME_PATTERN.pattern}")


def check_priority(value: int | None) -> None:
    if value is not None and not 0 <= value <= 4:
        raise invalid(f"`priority` must be 0-4 (0 highest), got {value}")


def check_choice(field: str, value: str | None, choices: Iterable[str]) -> None:
    options = tuple(choices)
    if value is not None and value not in options:
        raise invalid(f"`{field}` must be one of {', '.join(options)}, got {value[:40]!r}")
