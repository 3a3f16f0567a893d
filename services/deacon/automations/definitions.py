"""Automation files: ``<dir>/<name>.toml`` with an ``[automation]`` table, parsed and checked into ``Automation``
structs, or into an ``InvalidAutomation`` that names the file, the field and the problem.

No I/O but reading the files: parsed files are cached by modification time and size, so an edited file applies
at the next reconcile and an unchanged one costs a ``stat``. One broken file never hides the others.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from services.deacon.automations import cron
from shared.core.durations import parse_duration
from shared.core.errors import CommandError
from shared.core.ids import ID_PATTERN, is_valid_id
from shared.core.subjects import EVT_PREFIX, event_subject
from shared.core.trusted_files import trust_problem
from shared.model.commands.base import MAX_TITLE, VAR_NAME_PATTERN, check_vars
from shared.model.events import REGISTRY

SUFFIX = ".toml"
GATES = ("cooldown", "cron", "event", "condition", "manual")
GATE_KEYS: dict[str, tuple[str, ...]] = {
    "cooldown": ("interval",),
    "cron": ("schedule", "timezone"),
    "event": ("on", "subject"),
    "condition": ("check", "check_timeout", "interval"),
    "manual": (),
}
COMMON_KEYS = ("description", "gate", "enabled", "exec", "timeout", "formula", "rig", "title", "vars")
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_CHECK_TIMEOUT_S = 10.0
DEFAULT_CHECK_INTERVAL_S = 60.0
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_COMMAND_LINE = 4096
MAX_DESCRIPTION = 2000
DEFAULT_GRACE_S = 10.0
_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


class Automation(msgspec.Struct, frozen=True, kw_only=True):
    """One usable automation file."""

    name: str
    path: str
    description: str = ""
    enabled: bool = True
    gate: str
    interval_s: float | None = None
    """cooldown: seconds from one fire to the next; condition: seconds between checks."""
    schedule: cron.Schedule | None = None
    timezone: str = "UTC"
    """cron: the zone whose wall clock the schedule reads."""
    on: str | None = None
    """event: the event type that opens the gate."""
    subject: str | None = None
    """event: only events on subjects matching this NATS pattern (``*``, ``>``) count."""
    check: str | None = None
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    action: str
    """exec or formula."""
    exec: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    formula: str | None = None
    rig: str | None = None
    title: str = ""
    vars: dict[str, str] = {}


class InvalidAutomation(msgspec.Struct, frozen=True, kw_only=True):
    """A file that cannot be used, and why."""

    name: str
    path: str
    field: str
    """The offending key (``automation.interval``), or "" for the file as a whole."""
    problem: str
    refused: bool = False
    """Not read at all: someone other than the deacon's user or root could have written it (``trust_problem``)."""

    @property
    def message(self) -> str:
        where = f"`{self.field}` " if self.field else ""
        return f"automation file {self.path}: {where}{self.problem}"


class Definitions(msgspec.Struct, frozen=True, kw_only=True):
    automations: dict[str, Automation] = {}
    invalid: dict[str, InvalidAutomation] = {}


class AutomationSettings(msgspec.Struct, frozen=True, kw_only=True):
    directory: Path
    """Where the files are (``GT_AUTOMATIONS_DIR``, default ``$GT_HOME/automations``)."""
    grace_s: float = DEFAULT_GRACE_S
    """Added to an exec run's timeout to make its lease (``GT_AUTOMATION_GRACE``): only past the lease may a
    deacon other than the one running it settle the run as failed."""


def load_settings(env: Mapping[str, str], gt_home: Path) -> AutomationSettings:
    """Raises ValueError naming a setting whose value cannot be used."""
    directory = env.get("GT_AUTOMATIONS_DIR")
    grace_text = env.get("GT_AUTOMATION_GRACE")
    grace = DEFAULT_GRACE_S
    if grace_text:
        try:
            grace = float(grace_text)
        except ValueError:
            grace = -1.0
        if grace < 0:
            raise ValueError(f"GT_AUTOMATION_GRACE must be a number of seconds of at least 0, got {grace_text!r}")
    return AutomationSettings(
        directory=Path(directory).expanduser() if directory else gt_home / "automations", grace_s=grace
    )


class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(problem)


def parse(name: str, path: str, text: str) -> Automation | InvalidAutomation:
    """One file's text as an automation, or what is wrong with it."""
    try:
        return _parse(name, path, text)
    except _Invalid as exc:
        return InvalidAutomation(name=name, path=path, field=exc.field, problem=exc.problem)


def _parse(name: str, path: str, text: str) -> Automation:
    if not is_valid_id(name):
        raise _Invalid(
            "", f"the file name gives the automation name {name[:80]!r}, which must match {ID_PATTERN.pattern}"
        )
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _Invalid("", f"is not valid TOML: {exc}") from None
    extra = sorted(set(doc) - {"automation"})
    if extra:
        raise _Invalid(extra[0], "is not known here: the file holds one [automation] table")
    table = doc.get("automation")
    if not isinstance(table, dict):
        raise _Invalid("automation", "is missing: the file must have an [automation] table")
    gate = _text(table, "gate", required=True)
    if gate not in GATES:
        raise _Invalid("automation.gate", f"must be one of {', '.join(GATES)}, got {gate!r}")
    known = set(COMMON_KEYS).union(*GATE_KEYS.values())
    for key in table:
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise _Invalid(f"automation.{key}", f"is not a known key{did_you_mean}")
        if key not in COMMON_KEYS and key not in GATE_KEYS[gate]:
            owner = next(g for g, keys in GATE_KEYS.items() if key in keys)
            raise _Invalid(f"automation.{key}", f'is only for gate = "{owner}"; this file has gate = "{gate}"')
    fields: dict[str, Any] = {"name": name, "path": path, "gate": gate}
    fields["description"] = _text(table, "description", limit=MAX_DESCRIPTION) or ""
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _Invalid("automation.enabled", f"must be true or false, got {enabled!r}")
    fields["enabled"] = enabled
    fields.update(_gate_fields(name, gate, table))
    fields.update(_action_fields(table))
    return Automation(**fields)


def _gate_fields(name: str, gate: str, table: dict[str, Any]) -> dict[str, Any]:
    if gate == "cooldown":
        interval = _duration(table, "interval")
        if interval is None:
            raise _Invalid("automation.interval", 'is required for gate = "cooldown" (e.g. interval = "10m")')
        return {"interval_s": interval}
    if gate == "cron":
        text = _text(table, "schedule", required=True, why='for gate = "cron" (e.g. schedule = "0 3 * * *")')
        try:
            schedule = cron.parse(text)
        except cron.CronError as exc:
            raise _Invalid("automation.schedule", str(exc)) from None
        zone = _text(table, "timezone") or "UTC"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise _Invalid("automation.timezone", f"{zone!r} is not a time zone (e.g. UTC, Europe/Berlin)") from None
        return {"schedule": schedule, "timezone": zone}
    if gate == "event":
        on = _text(table, "on", required=True, why='for gate = "event" (e.g. on = "bead.closed")')
        known = REGISTRY.classes()
        cls = known.get(on)
        if cls is None:
            hint = difflib.get_close_matches(on, sorted(known), n=3)
            extra = f" (did you mean {', '.join(hint)}?)" if hint else " (`gt schema` lists them)"
            raise _Invalid("automation.on", f"{on!r} is not an event type this deacon knows{extra}")
        subject = _text(table, "subject")
        if subject is not None:
            _check_subject(subject, cls.AGGREGATE)
        if cls.AGGREGATE == "automation":
            if subject is None:
                raise _Invalid(
                    "automation.subject",
                    f"is required with on = {on!r}: name the automation to follow "
                    f"({event_subject('automation', '<name>')})",
                )
            if subject_matches(subject, f"{EVT_PREFIX}.automation.{name}"):
                problem = f"{subject!r} matches this automation's own events: it would fire itself"
                raise _Invalid("automation.subject", problem)
        return {"on": on, "subject": subject}
    if gate == "condition":
        check = _text(table, "check", required=True, why='for gate = "condition" (a shell command; exit 0 = due)')
        if len(check) > MAX_COMMAND_LINE:
            raise _Invalid("automation.check", f"is {len(check)} characters; the limit is {MAX_COMMAND_LINE}")
        interval = _duration(table, "interval")
        check_timeout = _duration(table, "check_timeout")
        return {
            "check": check,
            "interval_s": DEFAULT_CHECK_INTERVAL_S if interval is None else interval,
            "check_timeout_s": DEFAULT_CHECK_TIMEOUT_S if check_timeout is None else check_timeout,
        }
    return {}


def _action_fields(table: dict[str, Any]) -> dict[str, Any]:
    has_exec, has_formula = "exec" in table, "formula" in table
    if has_exec == has_formula:
        problem = "both are given" if has_exec else "neither is given"
        raise _Invalid("automation.exec", f"an automation has exactly one action, exec or formula + rig: {problem}")
    if has_exec:
        for key in ("rig", "title", "vars"):
            if key in table:
                raise _Invalid(f"automation.{key}", "goes with a formula action, not with exec")
        command = _text(table, "exec", required=True)
        if len(command) > MAX_COMMAND_LINE:
            raise _Invalid("automation.exec", f"is {len(command)} characters; the limit is {MAX_COMMAND_LINE}")
        timeout = _duration(table, "timeout")
        return {"action": "exec", "exec": command, "timeout_s": DEFAULT_TIMEOUT_S if timeout is None else timeout}
    if "timeout" in table:
        raise _Invalid(
            "automation.timeout", "goes with exec; a formula run stays open until the bead it slung is closed"
        )
    formula = _text(table, "formula", required=True)
    if not is_valid_id(formula):
        raise _Invalid("automation.formula", f"{formula!r} is not a formula name ({ID_PATTERN.pattern})")
    rig = _text(table, "rig", required=True, why="with a formula: the rig the bead is slung to")
    if not is_valid_id(rig):
        raise _Invalid("automation.rig", f"{rig!r} is not a rig name ({ID_PATTERN.pattern})")
    title = _text(table, "title", limit=MAX_TITLE) or ""
    raw_vars = table.get("vars", {})
    if not isinstance(raw_vars, dict):
        raise _Invalid("automation.vars", 'must be a table of strings (vars = { feature = "widgets" })')
    variables: dict[str, str] = {}
    for key, value in raw_vars.items():
        if not VAR_NAME_PATTERN.fullmatch(key):
            raise _Invalid(f"automation.vars.{key}", f"is not a var name ({VAR_NAME_PATTERN.pattern})")
        if not isinstance(value, str):
            raise _Invalid(f"automation.vars.{key}", f"must be a string, got {value!r}")
        variables[key] = value
    try:
        # The rule the run's sling (BeadSling) is checked by: a file it would be refused for is refused here,
        # when it is read, not at each fire.
        check_vars("automation.vars", variables)
    except CommandError as exc:
        raise _Invalid("automation.vars", exc.message.removeprefix("`automation.vars` ")) from None
    return {"action": "formula", "formula": formula, "rig": rig, "title": title, "vars": variables}


def _text(
    table: dict[str, Any], key: str, *, required: bool = False, why: str = "", limit: int = MAX_COMMAND_LINE * 4
) -> Any:
    value = table.get(key)
    if value is None:
        if required:
            raise _Invalid(f"automation.{key}", "is required" + (f" {why}" if why else ""))
        return None
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(f"automation.{key}", f"must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise _Invalid(f"automation.{key}", f"is {len(value)} characters; the limit is {limit}")
    return value


def _duration(table: dict[str, Any], key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise _Invalid(f"automation.{key}", str(exc)) from None
    if not 1.0 <= seconds <= MAX_DURATION_S:
        raise _Invalid(f"automation.{key}", f"must be from 1s to 7d, got {value!r}")
    return seconds


def _check_subject(subject: str, aggregate: str) -> None:
    tokens = subject.split(".")
    if any(t not in ("*", ">") and not _TOKEN.fullmatch(t) for t in tokens) or ">" in tokens[:-1]:
        raise _Invalid("automation.subject", f"{subject!r} is not a subject pattern (tokens, '*', and '>' last)")
    if not _can_match(tokens, aggregate):
        raise _Invalid(
            "automation.subject",
            f"{subject!r} can never match: events of that type are stored on {EVT_PREFIX}.{aggregate}.<id>",
        )


def _can_match(tokens: list[str], aggregate: str) -> bool:
    """Whether the pattern matches some ``gt.evt.<aggregate>.<id>``."""
    fixed = [*EVT_PREFIX.split("."), aggregate]
    for index, part in enumerate(tokens):
        if part == ">":
            return index <= len(fixed)
        if index < len(fixed):
            if part not in ("*", fixed[index]):
                return False
        elif index > len(fixed) or (part != "*" and not is_valid_id(part)):
            return False
    return len(tokens) == len(fixed) + 1


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for index, part in enumerate(want):
        if part == ">":
            return len(have) > index
        if index >= len(have) or (part not in ("*", have[index])):
            return False
    return len(want) == len(have)


class AutomationCatalog:
    """The automation files of one directory, re-read when they change. Files, or a directory, that someone other
    than the deacon's user or root could have written are refused, never read (``trust_problem``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[Path, tuple[int, int, Automation | InvalidAutomation]] = {}

    def load(self) -> Definitions:
        automations: dict[str, Automation] = {}
        invalid: dict[str, InvalidAutomation] = {}
        seen: set[Path] = set()
        files = _files(self.directory)
        directory_problem = trust_problem(self.directory, "directory") if files else None
        for path in files:
            seen.add(path)
            problem = directory_problem or trust_problem(path, "file")
            if problem is not None:
                name = path.name.removesuffix(SUFFIX)
                invalid[name] = InvalidAutomation(name=name, path=str(path), field="", problem=problem, refused=True)
                continue
            parsed = self._parse(path)
            if isinstance(parsed, Automation):
                automations[parsed.name] = parsed
            else:
                invalid[parsed.name] = parsed
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return Definitions(automations=automations, invalid=invalid)

    def _parse(self, path: Path) -> Automation | InvalidAutomation:
        name = path.name.removesuffix(SUFFIX)
        try:
            info = path.stat()
        except OSError as exc:
            return InvalidAutomation(name=name, path=str(path), field="", problem=f"cannot be read: {exc}")
        cached = self._cache.get(path)
        if cached is not None and cached[:2] == (info.st_mtime_ns, info.st_size):
            return cached[2]
        try:
            result = parse(name, str(path), path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            result = InvalidAutomation(name=name, path=str(path), field="", problem=f"cannot be read: {exc}")
        self._cache[path] = (info.st_mtime_ns, info.st_size, result)
        return result


def _files(directory: Path) -> list[Path]:
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.endswith(SUFFIX) and not entry.is_dir()]
    except OSError:
        return []  # no directory: no automations
    return [directory / name for name in sorted(entry.name for entry in entries)]
