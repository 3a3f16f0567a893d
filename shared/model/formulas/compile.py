"""Parsing and cooking formulas. Pure: text in, steps out; no files are read here.

A formula file (``<name>.formula.toml``)::

    formula = "polecat-work"          # must match the file name
    description = "..."
    version = 1

    [vars.feature]                    # or: feature = "default" under [vars]
    description = "..."
    default = "..."
    required = false

    [[steps]]
    id = "implement"
    title = "Implement {{feature}}"   # {{var}} is substituted when cooking
    description = "..."
    needs = ["load-context"]
    acceptance = "..."
    wait = { timer = "10m" }          # or { ci = "<command>" } or { human = "<question>" }
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any

import msgspec

from shared.core.durations import parse_duration
from shared.core.ids import is_valid_id
from shared.model.events.molecules import CiGate, HumanGate, StepGate, StepSpec, TimerGate
from shared.model.formulas.errors import FormulaError

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
ANY_PLACEHOLDER = re.compile(r"\{\{.*?\}\}")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
BUILTIN_VARS = ("bead", "bead_title", "rig")
"""Always available when cooking: the bead's id and title, and the rig it is slung to."""
_TOP_KEYS = {"formula", "description", "version", "type", "vars", "steps"}
_STEP_KEYS = {"id", "title", "description", "needs", "acceptance", "wait"}
_GATE_KINDS = ("timer", "ci", "human")
MAX_TIMER_S = 30 * 86400.0
"""The longest a timer gate may wait (30 days): a longer one is a typo more often than a plan."""
MAX_GATE_TEXT = 2000
"""The longest CI command or human question a gate may hold."""
_VAR_KEYS = {"description", "default", "required"}


class FormulaVar(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str = ""
    default: str | None = None
    required: bool = False


class Formula(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed, validated formula: its steps are in file order and form no cycle."""

    name: str
    source: str
    description: str = ""
    version: int = 1
    vars: list[FormulaVar] = []
    steps: list[StepSpec]


def parse_formula(text: str, *, source: str, expected_name: str | None = None) -> Formula:
    """Parse and validate formula ``text`` read from ``source`` (named in every error).

    Raises:
        FormulaError: bad TOML, unknown keys, missing fields, duplicate step ids, unknown ``needs``,
            a dependency cycle, or a name that does not match ``expected_name``.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FormulaError(source, f"not valid TOML: {exc}") from exc
    _no_unknown_keys(source, "the formula", doc, _TOP_KEYS)
    name = _text(source, "formula", doc.get("formula"), required=True)
    if not is_valid_id(name):
        raise FormulaError(source, f"`formula` {name!r} is not a valid name (lowercase letters, digits, '-', '_')")
    if expected_name is not None and name != expected_name:
        raise FormulaError(source, f"`formula` is {name!r} but the file is named for {expected_name!r}")
    kind = doc.get("type", "workflow")
    if kind != "workflow":
        raise FormulaError(source, f"`type` {kind!r} is not supported (only workflow formulas are)")
    version = doc.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FormulaError(source, f"`version` must be a whole number from 1, got {version!r}")
    formula_vars = _parse_vars(source, doc.get("vars", {}))
    steps = _parse_steps(source, doc.get("steps"))
    _check_needs(source, steps)
    return Formula(
        name=name,
        source=source,
        description=_text(source, "description", doc.get("description", "")),
        version=version,
        vars=formula_vars,
        steps=steps,
    )


def cook(
    formula: Formula, given: Mapping[str, str], builtins: Mapping[str, str]
) -> tuple[list[StepSpec], dict[str, str]]:
    """The formula's steps with ``{{var}}`` substituted, and the vars used.

    Vars are the formula's defaults, then ``builtins`` (bead, bead_title, rig), then ``given``.

    Raises:
        FormulaError: a var that is not declared is given, a required var is missing, or a step title
            still holds a ``{{...}}`` after substitution.
    """
    declared = {v.name for v in formula.vars}
    unknown = sorted(set(given) - declared - set(BUILTIN_VARS))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise FormulaError(formula.source, f"unknown vars {', '.join(unknown)} (the formula declares: {known})")
    values: dict[str, str] = {v.name: v.default for v in formula.vars if v.default is not None}
    values.update(builtins)
    values.update(given)
    missing = sorted(v.name for v in formula.vars if v.required and not values.get(v.name))
    if missing:
        raise FormulaError(formula.source, f"missing required vars: {', '.join(missing)}")

    def substitute(text: str) -> str:
        return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    def wait_of(step: StepSpec) -> StepGate | None:
        match step.wait:
            case CiGate(command=command):
                # The vars go to the command as its environment, never into its text (``parse``: no ``{{...}}``).
                return CiGate(command=command, vars=dict(values))
            case HumanGate(question=question):
                return HumanGate(question=substitute(question))
        return step.wait

    steps = []
    for step in formula.steps:
        title = substitute(step.title)
        leftover = ANY_PLACEHOLDER.search(title)
        if leftover:
            raise FormulaError(formula.source, f"step {step.id!r}: unresolved {leftover.group(0)} in its title")
        steps.append(
            StepSpec(
                id=step.id,
                title=title,
                description=substitute(step.description),
                needs=list(step.needs),
                acceptance=substitute(step.acceptance),
                wait=wait_of(step),
            )
        )
    used = {k: v for k, v in values.items() if k in declared or k in given}
    return steps, used


def _no_unknown_keys(source: str, where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise FormulaError(
            source, f"{where} has unknown keys {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def _text(source: str, field: str, value: Any, *, required: bool = False) -> str:
    if value is None or (required and value == ""):
        raise FormulaError(source, f"`{field}` is required")
    if not isinstance(value, str):
        raise FormulaError(source, f"`{field}` must be a string, got {type(value).__name__}")
    return value


def _parse_vars(source: str, table: Any) -> list[FormulaVar]:
    if not isinstance(table, dict):
        raise FormulaError(source, "`vars` must be a table")
    out = []
    for name, spec in table.items():
        if not VAR_NAME.fullmatch(name):
            raise FormulaError(source, f"var name {name!r} must match {VAR_NAME.pattern}")
        if isinstance(spec, str):
            out.append(FormulaVar(name=name, default=spec))
            continue
        if not isinstance(spec, dict):
            raise FormulaError(source, f"var {name!r} must be a string default or a table")
        _no_unknown_keys(source, f"var {name!r}", spec, _VAR_KEYS)
        required = spec.get("required", False)
        if not isinstance(required, bool):
            raise FormulaError(source, f"var {name!r}: `required` must be true or false")
        default = spec.get("default")
        if default is not None and not isinstance(default, str):
            raise FormulaError(source, f"var {name!r}: `default` must be a string")
        out.append(
            FormulaVar(
                name=name,
                description=_text(source, f"vars.{name}.description", spec.get("description", "")),
                default=default,
                required=required,
            )
        )
    return out


def _parse_steps(source: str, raw: Any) -> list[StepSpec]:
    if not isinstance(raw, list) or not raw:
        raise FormulaError(source, "a formula needs at least one [[steps]] entry")
    steps: list[StepSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw, start=1):
        if not isinstance(entry, dict):
            raise FormulaError(source, f"step {index} must be a table")
        step_id = _text(source, f"steps[{index}].id", entry.get("id"), required=True)
        _no_unknown_keys(source, f"step {step_id!r}", entry, _STEP_KEYS)
        if not is_valid_id(step_id):
            raise FormulaError(source, f"step id {step_id!r} is not a valid id (lowercase letters, digits, '-', '_')")
        if step_id in seen:
            raise FormulaError(source, f"duplicate step id {step_id!r}")
        seen.add(step_id)
        needs = entry.get("needs", [])
        if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
            raise FormulaError(source, f"step {step_id!r}: `needs` must be a list of step ids")
        steps.append(
            StepSpec(
                id=step_id,
                title=_text(source, f"step {step_id!r} title", entry.get("title"), required=True),
                description=_text(source, f"step {step_id!r} description", entry.get("description", "")),
                needs=list(dict.fromkeys(needs)),
                acceptance=_text(source, f"step {step_id!r} acceptance", entry.get("acceptance", "")),
                wait=_parse_wait(source, step_id, entry.get("wait")),
            )
        )
    return steps


def _parse_wait(source: str, step_id: str, raw: Any) -> StepGate | None:
    """A step's ``wait``: a table of exactly one of ``timer`` (a duration), ``ci`` (a command), ``human`` (a
    question)."""
    if raw is None:
        return None
    where = f"step {step_id!r} wait"
    if not isinstance(raw, dict):
        raise FormulaError(source, f'{where} must be a table such as {{ timer = "10m" }}, got {type(raw).__name__}')
    _no_unknown_keys(source, where, raw, set(_GATE_KINDS))
    if len(raw) != 1:
        raise FormulaError(source, f"{where} must name exactly one of {', '.join(_GATE_KINDS)}, got {len(raw)}")
    kind, value = next(iter(raw.items()))
    if kind == "timer":
        try:
            seconds = parse_duration(value)
        except (TypeError, ValueError) as exc:
            raise FormulaError(source, f"{where}.timer {exc}") from None
        if not 0 < seconds <= MAX_TIMER_S:
            raise FormulaError(source, f"{where}.timer must be more than 0s and at most 30d, got {value!r}")
        return TimerGate(seconds=seconds)
    text = _text(source, f"{where}.{kind}", value, required=True).strip()
    if not text:
        raise FormulaError(source, f"`{where}.{kind}` is required")
    if len(text) > MAX_GATE_TEXT:
        raise FormulaError(source, f"{where}.{kind} is {len(text)} characters; the limit is {MAX_GATE_TEXT}")
    placeholder = ANY_PLACEHOLDER.search(text) if kind == "ci" else None
    if placeholder is not None:
        raise FormulaError(
            source,
            f"{where}.ci holds {placeholder.group(0)}: a CI command takes no {{{{...}}}} (a value in shell text could "
            'be a command); its vars are in its environment: "$GT_VAR_<name>" ("$GT_VAR_bead")',
        )
    return CiGate(command=text) if kind == "ci" else HumanGate(question=text)


def _check_needs(source: str, steps: list[StepSpec]) -> None:
    ids = {s.id for s in steps}
    for step in steps:
        for need in step.needs:
            if need not in ids:
                raise FormulaError(source, f"step {step.id!r} needs unknown step {need!r}")
            if need == step.id:
                raise FormulaError(source, f"step {step.id!r} needs itself")
    # Depth-first search for a cycle; report it as a path a person can follow.
    graph = {s.id: s.needs for s in steps}
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        trail.append(node)
        for need in graph[node]:
            if state.get(need) == 1:
                cycle = [*trail[trail.index(need) :], need]
                raise FormulaError(source, f"dependency cycle: {' -> '.join(cycle)}")
            if need not in state:
                visit(need)
        trail.pop()
        state[node] = 2

    for step in steps:
        if step.id not in state:
            visit(step.id)
