"""Plain-text rendering for the CLI (``--json`` prints the data as it came)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO, cast

import msgspec

from gt.cli.colour import SEQUENCE
from gt.cli.town_view import human_age
from gt.narration import pane_lines
from shared.core.terminal import escape_line, escape_text, escaped_lines, json_safe
from shared.model import gates
from shared.model.beads import Bead, BeadDetail
from shared.model.commands.rigs import DEFAULT_GIT_EMAIL, DEFAULT_GIT_NAME
from shared.model.convoys import ConvoyView, DispatchView
from shared.model.escalations import Escalation
from shared.model.molecules import MoleculeView
from shared.model.queries.mayor import DepView, FormulaDetail, FormulaEntry
from shared.model.queries.refinery import JobView, MergeFigures, MqBoard, PausedQueue, StackedMr
from shared.model.rigs import RigView
from shared.model.sessions import Session

_JSON = msgspec.json.Encoder()
BAR_WIDTH = 20


def print_json(value: Any, out: TextIO | None = None) -> None:
    """``value`` as indented JSON on ``out`` (standard output as it is now), every control character in it a JSON
    escape: agents' text in a `--json` answer reaches no terminal raw either."""
    text = json_safe(msgspec.json.format(_JSON.encode(value), indent=2).decode())
    (out or sys.stdout).write(text + "\n")


# ---- what reaches the terminal ------------------------------------------------------------------
# Agent-written text (a mail, a bead's title or description, an escalation, a note) never reaches a terminal as it
# is: each renderer below escapes every field it prints (``escape_line`` for a field on one line, ``escape_text``
# for a body of lines), and whatever a command prints on standard output passes ``terminal_safe`` on its way out
# (``escaped_stdout``, around every command): a renderer that forgot a field still prints no control character.


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab escaped (``escape_text``), the colours
    ``Palette`` wrote left as they are."""
    parts = SEQUENCE.split(text)
    parts[::2] = [escape_text(part) for part in parts[::2]]
    return "".join(parts)


class EscapingWriter:
    """A text stream that writes to ``stream`` what ``terminal_safe`` makes of it; everything else is the stream's
    (``isatty``, ``fileno``, ``flush``, ``encoding``)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(terminal_safe(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def escaped_stdout() -> Iterator[None]:
    """Standard output through ``EscapingWriter`` while a command runs; as it was afterwards."""
    before = sys.stdout
    if isinstance(before, EscapingWriter):
        yield
        return
    sys.stdout = cast(TextIO, EscapingWriter(before))
    try:
        yield
    finally:
        sys.stdout = before


def _short_ts(value: str | datetime | None) -> str:
    """To the second, ``YYYY-MM-DD HH:MM:SS``."""
    if not value:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return escape_line(value.replace("T", " ")[:19])


def table(header: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    """Columns padded to their widest cell; the last column is not padded. Every cell is shown on one line, its
    control characters escaped (``escape_line``)."""
    if not rows:
        return empty
    all_rows = [tuple(escape_line(c) for c in header), *(tuple(escape_line(c) for c in r) for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(header) - 1)]
    lines = []
    for row in all_rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def bar(done: int, total: int) -> str:
    """``[#####.....] 3/6``."""
    filled = round(BAR_WIDTH * done / total) if total else 0
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}"


# ---- beads -------------------------------------------------------------------------------------


def bead_detail(bead: BeadDetail) -> str:
    e = escape_line
    lines = [
        f"{e(bead.id)}  {e(bead.title)}",
        f"  status:    {e(bead.status)}",
        f"  type:      {e(bead.type)}    priority: P{bead.priority}",
    ]
    named = (
        ("assignee", bead.assignee),
        ("parent", bead.parent),
        ("rig", bead.rig),
        ("session", bead.hook_session),
        ("agent", bead.agent),
    )
    for label, value in named:
        if value:
            lines.append(f"  {label + ':':<10} {e(value)}")
    for label, values in (("needs", bead.needs), ("labels", bead.labels), ("convoys", bead.convoys)):
        if values:
            lines.append(f"  {label + ':':<10} {', '.join(e(v) for v in values)}")
    if hold := bead.hold:
        waiting = ", ".join(e(w) for w in hold.waiting_for) or "nothing (the mayor slings it now)"
        lines.append(f"  held:      for rig {e(hold.rig)}, waiting for {waiting}")
    for key, meta in sorted(bead.metadata.items()):
        lines.append(f"  meta:      {e(key)}={e(meta)}")
    lines.append(f"  created:   {_short_ts(bead.created_at)} by {e(bead.created_by or '-')}")
    if bead.closed_at:
        reason = f" ({e(bead.close_reason)})" if bead.close_reason else ""
        lines.append(f"  closed:    {_short_ts(bead.closed_at)}{reason}")
    if bead.collected_molecule:
        molecule = e(bead.collected_molecule)
        lines.append(f"  molecule:  {molecule} (garbage-collected; `gt bead history` has its steps)")
    if bead.description:
        lines.append("")
        lines.extend(f"  {line}" for line in _body_lines(bead.description))
    return "\n".join(lines)


def bead_table(beads: list[Bead]) -> str:
    rows = [(b.id, b.status, f"P{b.priority}", b.type, b.assignee or "-", b.title) for b in beads]
    return table(("ID", "STATUS", "PRI", "TYPE", "ASSIGNEE", "TITLE"), rows, "(no beads)")


def deps_lines(deps: list[DepView]) -> str:
    rows = [(d.id, d.status or "(missing)") for d in deps]
    return table(("ID", "STATUS"), rows, "(no dependencies)")


def history_lines(entries: list[Any]) -> str:
    out = []
    for e in entries:
        detail = {k: v for k, v in e.data.items() if k != "bead_id" and v not in ([], {}, None, "")}
        fields = " ".join(f"{escape_line(k)}={escape_line(v)}" for k, v in detail.items())
        out.append(
            f"#{e.seq:<8} {_short_ts(e.ts)}  {escape_line(e.type):<14} by {escape_line(e.actor):<20} {fields}".rstrip()
        )
    return "\n".join(out)


# ---- rigs and sessions -------------------------------------------------------------------------

RIG_DEFAULTS = {"git_name": DEFAULT_GIT_NAME, "git_email": DEFAULT_GIT_EMAIL}
"""Settings a rig stores empty when it uses the default: shown as the default in force."""


def rig_detail(rig: RigView) -> str:
    """One rig's configuration, every field as its JSON carries it, ``key: value`` a line; a setting left at its
    default shows the default."""
    lines = []
    for key, value in msgspec.to_builtins(rig).items():
        if key in RIG_DEFAULTS and not value:
            value = f"{RIG_DEFAULTS[key]} (default)"
        lines.append(f"{escape_line(key)}: {escape_line(value)}")
    return "\n".join(lines)


# ---- sessions

SESSION_KEYS = ("id", "rig", "polecat", "bead", "status", "end_reason", "attempt", "worktree", "branch", "tmux_name")
PANE_LINES_SHOWN = 20
"""A session's recorded pane lines `gt session show` prints (the witness records at most this many)."""


def session_detail(session: Session) -> str:
    """One session: where it ran and, once it ended, how: its warrant, its end, whether it was escalated, and the
    last lines its pane showed when it was warranted (the cause of a death: an agent's last error) or, with no
    warrant, when the witness ended its pane (an agent's last words after `gt done`)."""
    e = escape_line
    named = ((k, getattr(session, k)) for k in SESSION_KEYS)
    lines = [f"{k}: {e(value)}" for k, value in named if value is not None]
    if session.warrant_reason:
        detail = f" ({e(session.warrant_detail)})" if session.warrant_detail else ""
        lines.append(f"warranted: {e(session.warrant_reason)}{detail}")
    if session.end_detail:
        lines.append(f"end_detail: {e(session.end_detail)}")
    if session.escalated:
        lines.append(f"escalated: {e(session.escalated)} (its bead is not respawned: `gt escalations`)")
    shown = pane_lines(session.pane_tail, PANE_LINES_SHOWN)
    if shown:
        when = "it was warranted" if session.warrant_reason else "its pane was ended"
        lines += ["", f"its pane's last lines when {when}:", *(f"  | {line}" for line in shown)]
    return "\n".join(lines)


# ---- formulas and molecules --------------------------------------------------------------------


def formula_table(formulas: list[FormulaEntry]) -> str:
    rows = [
        (
            f.name,
            f.layer,
            str(f.steps) if isinstance(f.steps, int) else "-",
            f"BROKEN: {f.error}" if f.error else f.description or "",
        )
        for f in formulas
    ]
    return table(("NAME", "LAYER", "STEPS", "DESCRIPTION"), rows, "(no formulas)")


def formula_detail(formula: FormulaDetail) -> str:
    e = escape_line
    lines = [f"{e(formula.name)} v{formula.version}  ({e(formula.source)})"]
    if formula.description:
        lines.append(f"  {e(formula.description)}")
    if formula.vars:
        lines.append("vars:")
        for var in formula.vars:
            flags = " (required)" if var.required else ""
            default = f" = {e(repr(var.default))}" if var.default is not None else ""
            description = f"  {e(var.description)}" if var.description else ""
            lines.append(f"  {e(var.name)}{default}{flags}{description}")
    lines.append("steps:")
    for step in formula.steps:
        needs = f"  (needs {', '.join(e(n) for n in step.needs)})" if step.needs else ""
        lines.append(f"  {e(step.id)}: {e(step.title)}{needs}")
        if step.wait is not None:
            lines.append(f"    waits on its gate: {e(gates.describe(step.wait))}")
    return "\n".join(lines)


_STEP_MARKS = {"done": "[x]", "in_progress": "[>]", "pending": "[ ]"}


def molecule_status(molecule: MoleculeView) -> str:
    e = escape_line
    state = "complete" if molecule.complete else f"current step: {e(molecule.current_step)}"
    lines = [
        f"{e(molecule.bead_id)}  {e(molecule.formula)} v{molecule.formula_version}  "
        f"{bar(molecule.done, molecule.total)}  {state}"
    ]
    for step in molecule.steps:
        mark = _STEP_MARKS.get(step.status, "[?]")
        pointer = "  <- current" if step.id == molecule.current_step else ""
        lines.append(f"  {mark} {e(step.id)}: {e(step.title)}{pointer}")
        if step.status != "done" and (gate := gates.step_gate_text(molecule.bead_id, step)) is not None:
            lines.append(f"      {e(gate)}")
    return "\n".join(lines)


# ---- convoys -----------------------------------------------------------------------------------


def convoy_table(convoys: list[ConvoyView]) -> str:
    rows = [(c.id, c.status, "owned" if c.owned else "auto", bar(c.closed, c.total), c.title) for c in convoys]
    # CLOSES: an owned convoy closes when landed (`gt convoy land`), the others by themselves with their beads.
    return table(("ID", "STATUS", "CLOSES", "PROGRESS", "TITLE"), rows, "(no convoys)")


def convoy_detail(convoy: ConvoyView, queues_paused: Mapping[str, PausedQueue] | None = None) -> str:
    """The convoy, and its beads wave by wave; ``queues_paused``: bead -> the paused merge queue its merge request
    waits in (the refinery's, read by the CLI)."""
    paused = queues_paused or {}
    owned = ", owned" if convoy.owned else ""
    landed = ", landed" if convoy.landed else ""
    held = f", {convoy.held} held" if convoy.held else ""
    lines = [
        f"{escape_line(convoy.id)}  {escape_line(convoy.title)}",
        f"  {escape_line(convoy.status)}{owned}{landed}  {bar(convoy.closed, convoy.total)}{held}",
    ]
    beads = sorted(convoy.bead_details or [], key=lambda b: b.wave)  # wave by wave
    rows = [
        (str(b.wave), b.id, _dispatch_state(b, paused.get(b.id)), b.rig or b.held_for or "-", b.title) for b in beads
    ]
    header = ("  WAVE", "BEAD", "STATUS", "RIG", "TITLE")
    lines.append(table(header, [(f"  {r[0]}", *r[1:]) for r in rows], "  (no beads)"))
    return "\n".join(lines)


def _dispatch_state(bead: DispatchView, queue_paused: PausedQueue | None) -> str:
    """A convoy bead's status, and for an open one what it waits for: ``held: waiting for X, Y`` when a
    convoy sling holds it (the mayor slings it once they close), ``blocked: ...`` when nothing does."""
    waiting = ", ".join(bead.waiting_for)
    if queue_paused is not None and bead.status != "closed":
        rig = queue_paused.rig
        return f"{bead.status}: merge queue of {rig} paused (`gt mq resume {rig}`)"
    if bead.held_for:
        return f"held: waiting for {waiting}" if waiting else "held: slinging now"
    return f"blocked: waiting for {waiting}" if waiting else str(bead.status)


# ---- the merge queue's board (`gt mq runners`) -----------------------------------------------------


def mq_board(board: MqBoard) -> str:
    """The runners, the jobs running and waiting with their stacks, and the merge figures (of each rig too)."""
    runners = table(
        ("RUNNER", "STATE", "HOST", "LAST BEAT", "JOB", "GATE", "FOR", "JOBS RUN"),
        [
            [
                r.name, r.state, r.host or "-", f"{human_age(r.beat_age_s)} ago" if r.last_beat else "-",
                f"{r.job} ({r.rig})" if r.job else "-", r.gate or "-", human_age(r.job_running_s),
                f"{r.jobs_run} ({r.jobs_passed} passed)",
            ]
            for r in board.runners
        ],
        "no gate runner has reported (gt-runner; GT_MQ_RUNNERS=N has the refinery gate on N of them)",
    )  # fmt: skip
    running = table(
        ("JOB", "RIG", "STACK", "RUNNER", "ATTEMPT", "GATE", "RUNNING", "QUIET"),
        [
            [j.id, j.rig, stack_text(j), j.runner, str(j.attempt), j.gate or "-", human_age(j.running_s),
             human_age(j.quiet_s)]
            for j in board.running
        ],
        "none",
    )  # fmt: skip
    waiting = table(
        ("JOB", "RIG", "STACK", "WAITING"),
        [[j.id, j.rig, stack_text(j), human_age(j.waited_s)] for j in board.waiting],
        "none",
    )
    used = f"{board.runners_used} at once" if board.runners_used else "none: the refinery gates itself"
    lines = [
        f"gate runners (the refinery gates on {used}):",
        runners,
        "",
        "gate jobs running:",
        running,
        "",
        "gate jobs waiting for a runner:",
        waiting,
        "",
        "merges (gate minutes: the gates of the batches that merged, each batch's once):",
        merge_table([board.merges, *board.rigs]),
    ]
    return "\n".join(lines)


def stack_text(job: JobView) -> str:
    """The merge requests a job's candidate carries, each with its bead; the target's tip itself when none (a cell of
    ``table``, which escapes it)."""
    return ", ".join(_stacked(s) for s in job.stack) if job.stack else f"{job.target} itself"


def _stacked(mr: StackedMr) -> str:
    return f"{mr.id} ({mr.bead})" if mr.bead else mr.id


def merge_table(figures: Sequence[MergeFigures]) -> str:
    """A row per rig (all rigs: ``*``) and window: merged, per hour, batches, gate minutes, gate minutes per merge."""
    rows = [
        [
            f.rig or "*", "last hour" if w.hours == 1 else f"last {w.hours} h", str(w.merged), f"{w.per_hour:g}",
            str(w.batches), f"{w.gate_seconds / 60:.2f}",
            "-" if w.gate_minutes_per_merge is None else f"{w.gate_minutes_per_merge:.2f}",
        ]
        for f in figures
        for w in (f.last_hour, f.last_day)
    ]  # fmt: skip
    return table(("RIG", "WINDOW", "MERGED", "PER HOUR", "BATCHES", "GATE MIN", "GATE MIN PER MERGE"), rows, "-")


def mq_summary(board: MqBoard) -> str:
    """One line under `gt mq list`: runners up, jobs running and waiting, merges in the last hour and day."""
    up = sum(1 for r in board.runners if r.alive)
    runners = f"runners: {up} of {len(board.runners)} up" if board.runners else "runners: none"
    jobs = f"gate jobs: {len(board.running)} running, {len(board.waiting)} waiting"
    hour, day = board.merges.last_hour, board.merges.last_day
    minutes = day.gate_minutes_per_merge
    per_merge = f", {minutes:.2f} gate min per merge" if minutes is not None else ""
    merged = f"merged: {hour.merged} in the last hour, {day.merged} in 24 h ({day.per_hour:g}/h over 24 h{per_merge})"
    return f"{runners}; {jobs}; {merged} (`gt mq runners` for more)"


# ---- mail and escalations ----------------------------------------------------------------------


def message_table(messages: list[Bead]) -> str:
    rows = [
        (m.id, "read" if "read" in m.labels else "new", m.metadata.get("from", "-"), _short_ts(m.created_at), m.title)
        for m in messages
    ]
    return table(("ID", "STATE", "FROM", "SENT", "SUBJECT"), rows, "(no messages)")


def message_detail(message: Bead) -> str:
    metadata = message.metadata
    e = escape_line
    lines = [
        f"{e(message.id)}  {e(message.title)}",
        f"  from:    {e(metadata.get('from', '-'))}",
        f"  to:      {e(message.assignee or '-')}",
        f"  sent:    {_short_ts(message.created_at)}",
        f"  thread:  {e(metadata.get('thread', '-'))}",
    ]
    if metadata.get("reply_to"):
        lines.append(f"  reply to: {e(metadata['reply_to'])}")
    lines.append("")
    if message.description:
        lines.extend(f"  {line}" for line in _body_lines(message.description))
    return "\n".join(lines)


def thread_lines(messages: list[Bead]) -> str:
    if not messages:
        return "(no messages)"
    out = []
    for m in messages:
        sender = escape_line(m.metadata.get("from", "-"))
        to, subject = escape_line(m.assignee), escape_line(m.title)
        out.append(f"{_short_ts(m.created_at)}  {sender} -> {to}: {subject}")
        if m.description:
            out.extend(f"    {line}" for line in _body_lines(m.description))
    return "\n".join(out)


def escalation_table(escalations: list[Escalation]) -> str:
    """One row each; a message of several lines (a pane's or git's last words) goes on under its column."""
    rows = []
    for e in escalations:
        raised = f"+{e.reescalations}" if e.reescalations else ""
        message = _body_lines(e.message)
        if e.status == "closed":  # `--all`: who closed it and why (the mayor names what resolved it)
            reason = f": {escape_line(e.close_reason)}" if e.close_reason else ""
            message.append(f"closed by {escape_line(e.closed_by or '?')}{reason}")
        rows.append((e.id, f"{e.severity}{raised}", e.status, e.source, _short_ts(e.raised_at), message))
    text = table(
        ("ID", "SEVERITY", "STATUS", "SOURCE", "RAISED", "MESSAGE"),
        [(*row[:-1], row[-1][0]) for row in rows],
        "(no escalations)",
    )
    if not rows:
        return text
    lines = text.split("\n")
    out = [lines[0]]
    for line, row in zip(lines[1:], rows, strict=True):
        out.append(line)
        indent = " " * (len(line) - len(escape_line(row[-1][0])))
        out.extend(f"{indent}{more}".rstrip() for more in row[-1][1:])
    return "\n".join(out)


def _body_lines(message: object) -> list[str]:
    """A body (a description, a message, an escalation's text) as the lines it shows, its control characters but
    newline and tab escaped, blank lines left out of the end (a pane's or git's last words, quoted, end with one)."""
    lines = escaped_lines(message)
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    return lines
