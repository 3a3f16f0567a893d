"""Events told as short sentences, for ``gt feed``, ``gt bead history`` and the dashboard. Pure.

``describe`` knows every event type of the log; a type it does not know (a newer version's) is told as
its fields, never dropped. A sentence quotes what agents wrote (a title, a reason, a note): it is one line of
printable text, every control character in it escaped (``shared.core.terminal.escape_line``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from shared.core.terminal import escape_line, escape_text, escaped_lines
from shared.model.events import RigAdded

Described = tuple[str, str]
"""(sentence, kind): kind picks the colour: ``good``, ``bad``, ``warn``, ``work``, ``info``, ``quiet``."""


def _s(value: Any, limit: int = 80) -> str:
    """``value`` on one line, its runs of spaces, tabs and newlines one space, every other control character
    escaped (``\\r``, ``\\x1b``), cut at ``limit``."""
    text = " ".join(escape_text(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _middle(value: Any, limit: int) -> str:
    """Cut in the middle, not at the end: a detail that names a path first says what came of it last."""
    text = " ".join(escape_text(value).split())
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def _fields(data: dict[str, Any]) -> str:
    shown = {k: v for k, v in data.items() if v not in ([], {}, None, "", False)}
    return " ".join(f"{k}={_s(v, 40)}" for k, v in shown.items())


def _bead_created(d: dict[str, Any]) -> Described:
    # Fields at their default are not stored: only what was given is told.
    extras = [str(d["type"])] if d.get("type") else []
    extras += [f"P{d['priority']}"] if d.get("priority") is not None else []
    tail = f" ({', '.join(extras)})" if extras else ""
    return f'bead {d["bead_id"]} created: "{_s(d.get("title", ""))}"{tail}', "info"


def _bead_updated(d: dict[str, Any]) -> Described:
    changed = sorted(k for k, v in d.items() if k != "bead_id" and v not in (None, [], {}))
    return f"bead {d['bead_id']} updated: {', '.join(changed) or 'nothing'}", "info"


def _bead_slung(d: dict[str, Any]) -> Described:
    convoy = f" (convoy {d['convoy_id']})" if d.get("convoy_id") else ""
    ignored = d.get("ignored_blockers") or []
    blockers = "s" if len(ignored) > 1 else ""
    forced = f" (forced past open blocker{blockers} {', '.join(ignored)})" if ignored else ""
    forced = forced or (" (forced)" if d.get("forced") else "")
    held = f" (held until {', '.join(d['held_for'])} closed)" if d.get("held_for") else ""
    agent = f" to run {d['agent']}" if d.get("agent") else ""
    return f"bead {d['bead_id']} slung to rig {d.get('rig')}{agent}{convoy}{forced}{held}", "work"


def _bead_held(d: dict[str, Any]) -> Described:
    waiting = ", ".join(d.get("blockers") or []) or "?"
    agent = f" to run {d['agent']}" if d.get("agent") else ""
    return f"bead {d['bead_id']} held for rig {d.get('rig')}{agent}: slung once {waiting} closed", "info"


def _bead_unslung(d: dict[str, Any]) -> Described:
    reason = f": {_s(d['reason'])}" if d.get("reason") else ""
    worktree = " (worktree to be removed)" if d.get("remove_worktree") else ""
    return f"bead {d['bead_id']} unslung from rig {d.get('rig')}, open again{reason}{worktree}", "warn"


def _session_cleaned(d: dict[str, Any]) -> Described:
    # A worktree left in place says why (unsaved work is never removed silently).
    why = f": {_middle(d['detail'], 160)}" if d.get("detail") else ""
    return f"session {d['session_id']} cleaned up{why}", "quiet"


def _default(event: type[msgspec.Struct], name: str) -> Any:
    """A field's default: events are stored without the fields that hold it, so a sentence fills it in."""
    return next(f.default for f in msgspec.structs.fields(event) if f.name == name)


def _rig_added(d: dict[str, Any]) -> Described:
    polecats = d.get("max_polecats", _default(RigAdded, "max_polecats"))
    return f"rig {d['rig']} added: {d.get('repo', '?')}, at most {polecats} polecats", "info"


def _rig_updated(d: dict[str, Any]) -> Described:
    changed = ", ".join(f"{k}={_s(v, 40)}" for k, v in sorted(d.items()) if k != "rig")
    return f"rig {d['rig']} updated: {changed or 'nothing'}", "info"


def _bead_closed(d: dict[str, Any]) -> Described:
    reason = f": {_s(d['reason'])}" if d.get("reason") else ""
    return f"bead {d['bead_id']} closed{reason}", "good"


def _session_requested(d: dict[str, Any]) -> Described:
    again = f", attempt {d['attempt']}" if int(d.get("attempt") or 1) > 1 else ""
    handoff = f", handoff of {d['handoff_of']}" if d.get("handoff_of") else ""
    return (
        f"session {d['session_id']} requested for bead {d.get('bead')}: polecat {d.get('rig')}/{d.get('polecat')}"
        f"{again}{handoff}",
        "work",
    )


def _session_started(d: dict[str, Any]) -> Described:
    adopted = " (adopted after a restart)" if d.get("adopted") else ""
    return f"session {d['session_id']} started, pid {d.get('pane_pid')}{adopted}", "work"


def _session_warranted(d: dict[str, Any]) -> Described:
    detail = f" ({_s(d['detail'])})" if d.get("detail") else ""
    return f"session {d['session_id']} WARRANTED: {d.get('reason')}{detail}", "bad"


def _session_ended(d: dict[str, Any]) -> Described:
    reason = d.get("reason") or "?"
    detail = f" ({_s(d['detail'])})" if d.get("detail") else ""
    return f"session {d['session_id']} ended: {reason}{detail}", "good" if reason == "done" else "warn"


def _session_hook_recovered(d: dict[str, Any]) -> Described:
    what = "re-slung" if d.get("resolution") == "resling" else str(d.get("resolution"))
    detail = f" ({_s(d['detail'])})" if d.get("detail") else ""
    return f"bead {d.get('bead')} {what} after its hook went stale in session {d['session_id']}{detail}", "warn"


def _mr_submitted(d: dict[str, Any]) -> Described:
    return (
        f"merge request {d['mr_id']} queued for bead {d.get('bead')}: {d.get('branch')} -> {d.get('target')}",
        "work",
    )


def _mr_claimed(d: dict[str, Any]) -> Described:
    batch = f" in a batch of {len(d['batch'])}" if d.get("batch") and len(d["batch"]) > 1 else ""
    return f"merge request {d['mr_id']} taken by the refinery, attempt {d.get('attempt')}{batch}", "work"


def _mr_merged(d: dict[str, Any]) -> Described:
    commit = str(d.get("merged_commit") or "")[:10]
    already = " (already on the target)" if d.get("already") else ""
    batch = f" in a batch of {len(d['batch'])}" if isinstance(d.get("batch"), list) and len(d["batch"]) > 1 else ""
    return f"merge request {d['mr_id']} MERGED at {commit}{already}{batch}", "good"


def _mr_failed(d: dict[str, Any]) -> Described:
    escalated = ", escalated" if d.get("escalated") else ""
    return f"merge request {d['mr_id']} failed gate {d.get('gate')} (exit {d.get('exit_code')}){escalated}", "bad"


def _mr_requeued(d: dict[str, Any]) -> Described:
    retry = f" (retry {d['retries']}, not before {d.get('not_before')})" if d.get("retries") else ""
    return f"merge request {d['mr_id']} requeued: {d.get('reason', '?')}{retry}", "warn"


def _mr_conflicted(d: dict[str, Any]) -> Described:
    files = ", ".join(d.get("files") or [])
    to = "sent back to its agent" if d.get("sent_back") else "a conflict bead for the operator"
    return f"merge request {d['mr_id']} conflicts with the target: {_s(files) or 'files unknown'}; {to}", "bad"


def _gate_requested(d: dict[str, Any]) -> Described:
    stack = d.get("stack") or []
    what = f"{len(stack)} merge request(s) ({_s(', '.join(stack))})" if stack else f"the tip of {d.get('target')}"
    return f"gate job {d.get('job_id')} for rig {d.get('rig')}: {what} at {str(d.get('commit', '?'))[:10]}", "info"


def _gate_finished(d: dict[str, Any]) -> Described:
    if d.get("error"):
        return f"gate job {d.get('job_id')} could not run on {d.get('runner')}: {_s(d['error'])}", "warn"
    failed = [r.get("gate") for r in d.get("results") or [] if r.get("exit_code")]
    if d.get("passed"):
        return f"gate job {d.get('job_id')} passed on {d.get('runner')}", "good"
    return f"gate job {d.get('job_id')} failed gate {failed[0] if failed else '?'} on {d.get('runner')}", "bad"


def _escalation_raised(d: dict[str, Any]) -> Described:
    bead = f" about bead {d['bead']}" if d.get("bead") else ""
    return (
        f"escalation {d['escalation_id']} raised ({d.get('severity')}) by {d.get('source')}{bead}: "
        f"{_s(d.get('message', ''))}",
        "bad",
    )


def _convoy_created(d: dict[str, Any]) -> Described:
    return f'convoy {d["convoy_id"]} created: "{_s(d.get("title", ""))}" with {len(d.get("beads") or [])} beads', "info"


def _convoy_closed(d: dict[str, Any]) -> Described:
    landed = "landed" if d.get("landed") else "closed"
    return f"convoy {d['convoy_id']} {landed}: {d.get('closed_beads')}/{d.get('total_beads')} beads closed", "good"


def _session_usage(d: dict[str, Any]) -> Described:
    models = [m for m in d.get("models") or [] if isinstance(m, dict)]
    tokens = sum(
        int(m.get(f) or 0)
        for m in models
        for f in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    names = ", ".join(str(m.get("model")) for m in models) or "no model"
    final = " (final)" if d.get("final") else ""
    return f"session {d.get('session_id')} has used {tokens} tokens of {names} on bead {d.get('bead')}{final}", "quiet"


def _cmd_rejected(d: dict[str, Any]) -> Described:
    return f"command {d.get('command')} rejected: {d.get('code')}: {_s(d.get('message', ''))}", "warn"


def _cmd_accepted(d: dict[str, Any]) -> Described:
    return f"command {d.get('command')} accepted", "quiet"


def _plain(template: str, kind: str) -> Callable[[dict[str, Any]], Described]:
    def describe(d: dict[str, Any]) -> Described:
        return template.format_map(_Missing(d)), kind

    return describe


class _Missing(dict[str, Any]):
    """``str.format_map`` that shows ``?`` for a field an older or newer event lacks."""

    def __missing__(self, key: str) -> str:
        return "?"


DESCRIBERS: dict[str, Callable[[dict[str, Any]], Described]] = {
    "bead.created": _bead_created,
    "bead.updated": _bead_updated,
    "bead.claimed": _plain("bead {bead_id} claimed by {assignee}", "info"),
    "bead.slung": _bead_slung,
    "bead.held": _bead_held,
    "bead.closed": _bead_closed,
    "bead.unslung": _bead_unslung,
    "molecule.attached": lambda d: (
        f"molecule {d.get('formula')} attached to bead {d['bead_id']}: {len(d.get('steps') or [])} steps",
        "info",
    ),
    "step.started": _plain("bead {bead_id}: step {step} started", "work"),
    "step.done": _plain("bead {bead_id}: step {step} done", "good"),
    "step.gate_opened": _plain("bead {bead_id}: the gate of step {step} opened ({by})", "good"),
    "molecule.completed": _plain("bead {bead_id}: every step done", "good"),
    "molecule.rework_added": lambda d: (
        f"bead {d['bead_id']}: merge request {d.get('mr_id')} sent back ({d.get('reason')}): rework steps "
        f"{', '.join(str(s.get('id')) for s in d.get('steps') or [])} appended",
        "warn",
    ),
    "session.requested": _session_requested,
    "session.started": _session_started,
    "session.done_intent": _plain("session {session_id} says it is done", "work"),
    "session.warranted": _session_warranted,
    "session.ended": _session_ended,
    "session.cleaned": _session_cleaned,
    "session.escalated": _plain("session {session_id} escalated: {reason}", "bad"),
    "session.hook_recovered": _session_hook_recovered,
    "session.usage": _session_usage,
    "mr.submitted": _mr_submitted,
    "mr.claimed": _mr_claimed,
    "mr.merged": _mr_merged,
    "mr.failed": _mr_failed,
    "mr.conflicted": _mr_conflicted,
    "mr.requeued": _mr_requeued,
    "mr.rejected": _plain("merge request {mr_id} rejected: {reason}", "warn"),
    "mq.paused": lambda d: (f"merge queue of rig {d.get('rig')} PAUSED: {_s(d.get('reason', ''), 200)}", "bad"),
    "mq.resumed": _plain("merge queue of rig {rig} resumed", "good"),
    "mq.target_failed": _plain(
        "rig {rig}: the {gate} gate fails on {target} at {commit} too ({in_a_row} in a row): nobody blamed", "warn"
    ),
    "gate.requested": _gate_requested,
    "gate.started": _plain("gate job {job_id} taken by {runner} (attempt {attempt})", "info"),
    "gate.heartbeat": _plain("gate job {job_id}: {runner} runs gate {gate}", "info"),
    "gate.finished": _gate_finished,
    "gate.cancelled": _plain("gate job {job_id} cancelled: {reason}", "info"),
    "convoy.created": _convoy_created,
    "convoy.beads_added": lambda d: (f"convoy {d['convoy_id']}: {len(d.get('beads') or [])} beads added", "info"),
    "convoy.closed": _convoy_closed,
    "escalation.raised": _escalation_raised,
    "escalation.acked": _plain("escalation {escalation_id} acknowledged by {by}", "info"),
    "escalation.reescalated": _plain("escalation {escalation_id} re-escalated {from_severity} -> {to_severity}", "bad"),
    "escalation.closed": _plain("escalation {escalation_id} closed by {by}: {reason}", "good"),
    "rig.added": _rig_added,
    "rig.mass_death": lambda d: (
        f"rig {d['rig']}: {len(d.get('sessions') or [])} sessions died within {d.get('window_s')}s",
        "bad",
    ),
    "rig.updated": _rig_updated,
    "rig.parked": lambda d: (
        f"rig {d['rig']} parked: no new sessions" + (f" ({_s(d['reason'])})" if d.get("reason") else ""),
        "warn",
    ),
    "rig.unparked": _plain("rig {rig} unparked: sessions start again", "info"),
    "rig.removed": lambda d: (
        f"rig {d['rig']} removed" + (f" with {len(d['hooked'])} beads still hooked" if d.get("hooked") else ""),
        "warn",
    ),
    "lease.acquired": _plain("lease {lease} acquired by {holder} (token {token})", "quiet"),
    "lease.released": _plain("lease {lease} released by {holder}", "quiet"),
    "lease.expired": _plain("lease {lease} of {holder} expired", "warn"),
    "town_agent.started": _plain("the {name} agent started ({agent})", "good"),
    "town_agent.stopped": _plain("the {name} agent stopped", "info"),
    "town_agent.launched": _plain("the {name} agent's session launched (run {run})", "info"),
    "town_agent.asked": _plain("{asked_by} asked the {name} agent ({ask_id}): {text}", "info"),
    "town_agent.ask_delivered": _plain("request {ask_id} typed into the {name} agent (run {run})", "quiet"),
    "town_agent.answered": _plain("the {name} agent answered {ask_id}: {text}", "good"),
    "town_agent.told": _plain("the {name} agent was told of {notice}", "quiet"),
    "crew.added": _plain("crew member {rig}/{name} added on {branch}", "good"),
    "crew.ready": _plain("crew member {rig}/{name}'s workspace is made", "quiet"),
    "crew.hooked": _plain("bead {bead} hooked to crew member {rig}/{name}", "info"),
    "crew.removed": _plain("crew member {rig}/{name} removed", "info"),
    "crew.workspace_removed": _plain("crew member {rig}/{name}'s workspace: {detail}", "quiet"),
    "nudge.queued": _plain("nudge {nudge_id} queued for {rig}/{polecat}: {message}", "info"),
    "nudge.delivered": _plain("nudge {nudge_id} delivered to session {session}", "info"),
    "nudge.expired": _plain("nudge {nudge_id} expired: {reason}", "warn"),
    "service.up": _plain("service {service} up: instance {instance} on {host}", "quiet"),
    "service.down": _plain("service {service} DOWN: {reason}", "bad"),
    "service.stopped": _plain("service {service} stopped", "quiet"),
    "automation.fired": _plain("automation {automation} fired: {action} ({reason})", "info"),
    "automation.completed": _plain("automation {automation} completed", "good"),
    "automation.failed": _plain("automation {automation} failed: {error}", "bad"),
    "gc.swept": _plain("garbage collected everything closed before {cutoff}", "quiet"),
    "cmd.accepted": _cmd_accepted,
    "cmd.rejected": _cmd_rejected,
}


PANE_EXCERPT_LINES = 5
"""How many of a warranted session's last pane lines a timeline shows under the warrant."""


def pane_lines(tail: object, limit: int = PANE_EXCERPT_LINES) -> list[str]:
    """The last ``limit`` non-blank lines of a pane's recorded text, control characters escaped (the witness stored it
    cleaned; an event from elsewhere is escaped here, as it goes to a terminal: ``shared.core.terminal``)."""
    if not isinstance(tail, str):
        return []
    lines = [escape_line(line).rstrip() for line in escaped_lines(tail)]
    return [line for line in lines if line.strip()][-limit:] if limit > 0 else []


def excerpt(event_type: str, data: dict[str, Any]) -> list[str]:
    """Lines shown under the event's sentence in a timeline: a warrant's pane tail, where the cause of a death is
    (an agent's last error, its exit status). Most events have none."""
    if event_type == "session.warranted":
        return pane_lines(data.get("pane_tail"))
    return []


def describe(event_type: str, data: dict[str, Any]) -> Described:
    """The event as a sentence and its kind; an unknown type, or fields that do not fit, as its fields."""
    describer = DESCRIBERS.get(event_type)
    if describer is not None:
        try:
            sentence, kind = describer(data)
        except (KeyError, TypeError, ValueError):
            pass  # an event of another version: its fields still say what happened
        else:
            return escape_line(sentence), kind  # whatever field a sentence quotes as it is: one printable line
    return escape_line(f"{event_type} {_fields(data)}".rstrip()), "info"


KIND_STYLES: dict[str, tuple[str, ...]] = {
    "good": ("green",),
    "bad": ("red",),
    "warn": ("yellow",),
    "work": ("cyan",),
    "info": (),
    "quiet": ("dim",),
}


def bead_of(event_type: str, data: dict[str, Any]) -> str | None:
    """The bead an event is about, when its fields say (for filters and timelines)."""
    for key in ("bead_id", "bead"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None
