"""``gt status``: the town at a glance, as a plain dict (``--json``) and as text. Pure: the snapshot is
built from answers already fetched and the time is an argument.

The snapshot's sections each say ``None`` when the service that knows them did not answer, so a town with
a service down still shows everything else, and says which part is missing and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gt.cli.colour import PLAIN, STATE_STYLES, Palette, styled
from shared.core.terminal import escape_line, escaped_lines
from shared.model.events.merge_requests import MR_OPEN

if TYPE_CHECKING:
    from gt.cli.costs import CostLine

BAR_WIDTH = 20
SERVICES = ("mayor", "witness", "refinery", "deacon")


def _parse(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts)
    except ValueError:
        return None


def age_s(ts: str | None, now: datetime) -> float | None:
    when = _parse(ts)
    return None if when is None else max(0.0, (now - when).total_seconds())


def human_age(seconds: float | None) -> str:
    """``4s``, ``3m12s``, ``2h05m``, ``3d04h``; ``-`` for never."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def polecat_state(session: dict[str, Any]) -> str:
    if session.get("warranted_at"):
        return "warranted"
    if session.get("done_intent_at"):
        return "finishing"
    return "working" if session.get("status") == "started" else "starting"


def service_state(status: dict[str, Any] | None, stream_last_seq: int | None) -> dict[str, Any]:
    if status is None:
        return {"state": "not answering", "role": None, "last_seq": None, "lag": None, "applied": None}
    last = int(status.get("last_seq") or 0)
    lag = max(0, stream_last_seq - last) if stream_last_seq is not None else None
    if not status.get("connected"):
        state = "not answering"
    elif status.get("role") == "paused":
        state = "paused"
    elif not status.get("caught_up"):
        state = "catching up"
    else:
        state = "healthy"
    return {
        "state": state,
        "role": status.get("role"),
        "last_seq": last,
        "lag": lag,
        "applied": status.get("applied"),
        "uptime_s": status.get("uptime_s"),
    }


def superseded(mrs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Merge request -> the newer request of its bead that replaced it: every request of a bead but its newest
    (a conflicted or failed one whose bead was submitted again), unless it merged."""
    newest: dict[str, dict[str, Any]] = {}
    for m in mrs:
        known = newest.get(m["bead"])
        if known is None or str(m.get("submitted_at") or "") > str(known.get("submitted_at") or ""):
            newest[m["bead"]] = m
    return {
        m["id"]: newest[m["bead"]]["id"] for m in mrs if m["id"] != newest[m["bead"]]["id"] and m["status"] != "merged"
    }


def snapshot(
    *,
    now: datetime,
    stream_last_seq: int | None,
    statuses: dict[str, dict[str, Any] | None],
    rigs: list[dict[str, Any]] | None,
    sessions: list[dict[str, Any]] | None,
    heartbeats: dict[str, str],
    steps: dict[str, str | None],
    mrs: list[dict[str, Any]] | None,
    convoys: list[dict[str, Any]] | None,
    escalations: list[dict[str, Any]] | None,
    costs: dict[str, CostLine] | None = None,
    paused: list[dict[str, Any]] | None = None,
    runners: Sequence[str] = (),
    show_all: bool = False,
) -> dict[str, Any]:
    """The town as ``gt status --json`` prints it. ``heartbeats``: session id -> time of its last agent
    heartbeat; ``steps``: bead id -> its molecule's current step; ``costs``: rig -> its tokens and ``cost_usd``
    (``gt costs --by rig``); ``paused``: the rigs' paused merge queues (``PausedQueues``); ``runners``: the gate
    runners' scopes the deacon knows (``runner-<name>``), shown after the services. The merge queue shows
    the rigs of ``rigs`` (removed ones only when asked for them) and, unless ``show_all``, no request superseded by
    a newer one of its bead."""
    costs = costs or {}
    polecats = None
    if sessions is not None:
        polecats = [
            {
                "rig": s["rig"],
                "polecat": s["polecat"],
                "session": s["id"],
                "bead": s["bead"],
                "state": polecat_state(s),
                "step": steps.get(s["bead"]),
                "attempt": s.get("attempt"),
                "heartbeat_age_s": age_s(heartbeats.get(s["id"]), now),
                "started_age_s": age_s(s.get("started_at") or s.get("requested_at"), now),
            }
            for s in sorted(sessions, key=lambda s: (s["rig"], s["polecat"]))
        ]
    queue = None
    why_paused = {str(q["rig"]): str(q["reason"]) for q in paused or []}
    if mrs is not None:
        queue = {}
        replaced_by = superseded(mrs)
        shown_rigs = None if rigs is None else {str(r["name"]): int(r.get("incarnation") or 1) for r in rigs}

        def former(m: dict[str, Any]) -> bool:
            """Submitted to a rig of this name that was removed before it was added again."""
            return shown_rigs is not None and int(m.get("incarnation") or 1) != shown_rigs.get(m["rig"], 1)

        for rig in sorted({m["rig"] for m in mrs} | set(why_paused)):
            if shown_rigs is not None and rig not in shown_rigs:
                continue  # a removed rig's queue goes with it (`gt status --all` shows it)
            mine = [m for m in mrs if m["rig"] == rig and (show_all or (m["id"] not in replaced_by and not former(m)))]
            if not mine and rig not in why_paused:
                continue
            counts = Counter(m["status"] for m in mine)
            queue[rig] = {
                "counts": dict(sorted(counts.items())),
                "open": [
                    {
                        "id": m["id"],
                        "bead": m["bead"],
                        "status": m["status"],
                        "attempts": m.get("attempts", 0),
                        "superseded_by": replaced_by.get(m["id"]),
                        "former_rig": former(m),
                    }
                    for m in mine
                    if m["status"] in MR_OPEN
                ],
                "paused": why_paused.get(rig),
            }
    return {
        "at": now.isoformat(),
        "stream_last_seq": stream_last_seq,
        "services": {name: service_state(statuses.get(name), stream_last_seq) for name in (*SERVICES, *runners)},
        "rigs": None
        if rigs is None
        else [
            {
                "name": r["name"],
                "max_polecats": r.get("max_polecats"),
                "active_sessions": r.get("active_sessions", 0),
                "waiting_beads": r.get("waiting_beads", 0),
                "parked": bool(r.get("parked")),
                "removed": bool(r.get("removed")),
                "tokens": cost.tokens if (cost := costs.get(str(r["name"]))) is not None else 0,
                "cost_usd": cost.cost_usd if cost is not None else None,
            }
            for r in sorted(rigs, key=lambda r: str(r["name"]))
        ],
        "polecats": polecats,
        "merge_queue": queue,
        "convoys": None
        if convoys is None
        else [
            {"id": c["id"], "title": c.get("title", ""), "closed": c["closed"], "total": c["total"]} for c in convoys
        ],
        "escalations": None
        if escalations is None
        else [
            {
                "id": e["id"],
                "severity": e["severity"],
                "status": e["status"],
                "bead": e.get("bead"),
                "message": e["message"],
                "age_s": age_s(e.get("last_raised_at") or e.get("raised_at"), now),
            }
            for e in escalations
        ],
    }


# ---- text -----------------------------------------------------------------------------------------

Cell = str | tuple[str, tuple[str, ...]]


def progress_bar(done: int, total: int, palette: Palette = PLAIN, width: int = BAR_WIDTH) -> str:
    """``[#########...........] 9/20``; the filled part green on a terminal."""
    filled = min(width, round(width * done / total)) if total else 0
    return f"[{palette('#' * filled, 'green')}{'.' * (width - filled)}] {done}/{total}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Cell]], palette: Palette, indent: str = "  ") -> list[str]:
    """Columns padded on their plain text, then coloured, so colour never shifts a column. Every cell on one line,
    its control characters escaped (``escape_line``)."""
    safe: list[list[Cell]] = [
        [escape_line(c) if isinstance(c, str) else (escape_line(c[0]), c[1]) for c in row] for row in rows
    ]
    plain = [[c if isinstance(c, str) else c[0] for c in row] for row in safe]
    widths = [max(len(r[i]) for r in [list(header), *plain]) for i in range(len(header))]
    lines = [indent + "  ".join(h.ljust(widths[i]) for i, h in enumerate(header)).rstrip()]
    for row in safe:
        cells = []
        for i, cell in enumerate(row):
            text, styles = (cell, ()) if isinstance(cell, str) else cell
            padded = text.ljust(widths[i]) if i < len(row) - 1 else text
            cells.append(palette(text, *styles) + padded[len(text) :] if styles else padded)
        lines.append(indent + "  ".join(cells).rstrip())
    return lines


def _first_line(escalation: dict[str, Any]) -> str:
    """At a glance, an escalation's first line; what it quotes below it (a pane's or git's last lines) is in
    `gt escalations`."""
    lines = [line for line in escaped_lines(escalation["message"]) if line.strip()] or [""]
    return lines[0] + (" [more: gt escalations]" if len(lines) > 1 else "")


def _state_cell(state: str) -> Cell:
    return (state, STATE_STYLES.get(state, ()))


def _missing(service: str) -> str:
    return f"  ({service} not answering: unknown)"


LOG_MISSING = -1
"""``stream_last_seq`` of a town whose event log is gone."""


def render(snap: dict[str, Any], palette: Palette = PLAIN) -> str:
    head = palette
    at = snap["at"][:19].replace("T", " ")
    if snap["stream_last_seq"] == LOG_MISSING:
        where = head("the event log is MISSING", "red") + (
            ": the town's log is lost; its services refuse to start as an empty town "
            '(docs/failure-behaviour.md, "The log lost")'
        )
    else:
        where = f"log at seq {snap['stream_last_seq']}"
    out = [head("Town", "bold") + f"  at {at}, {where}"]

    out += ["", head("Services", "bold")]
    rows: list[list[Cell]] = []
    for name, s in snap["services"].items():
        lag = "-" if s["lag"] is None else str(s["lag"])
        applied = "-" if s["last_seq"] is None else str(s["last_seq"])
        rows.append([name, _state_cell(s["state"]), s["role"] or "-", applied, lag])
    out += _table(("SERVICE", "STATE", "ROLE", "APPLIED TO", "LAG"), rows, palette)

    out += ["", head("Rigs", "bold")]
    if snap["rigs"] is None:
        out.append(_missing("witness"))
    elif not snap["rigs"]:
        out.append("  (no rigs: `gt rig add` adds one)")
    else:
        rows = [
            [
                r["name"] + (" (removed)" if r.get("removed") else " (parked)" if r.get("parked") else ""),
                f"{r['active_sessions']}/{r['max_polecats']}",
                str(r["waiting_beads"]),
                str(r.get("tokens", 0)),
                "-" if r.get("cost_usd") is None else f"${r['cost_usd']:.2f}",
            ]
            for r in snap["rigs"]
        ]
        out += _table(("RIG", "POLECATS", "WAITING", "TOKENS", "COST"), rows, palette)

    out += ["", head("Polecats", "bold")]
    if snap["polecats"] is None:
        out.append(_missing("witness"))
    elif not snap["polecats"]:
        out.append("  (none working)")
    else:
        rows = [
            [
                f"{p['rig']}/{p['polecat']}",
                _state_cell(p["state"]),
                p["bead"],
                p["step"] or "-",
                human_age(p["heartbeat_age_s"]),
                human_age(p["started_age_s"]),
            ]
            for p in snap["polecats"]
        ]
        out += _table(("POLECAT", "STATE", "BEAD", "STEP", "HEARTBEAT", "AGE"), rows, palette)

    out += ["", head("Merge queue", "bold")]
    if snap["merge_queue"] is None:
        out.append(_missing("refinery"))
    elif not snap["merge_queue"]:
        out.append("  (empty)")
    else:
        for rig, q in snap["merge_queue"].items():
            counts = ", ".join(f"{n} {styled(palette, escape_line(status))}" for status, n in q["counts"].items())
            out.append(f"  {escape_line(rig)}: {counts}")
            if q.get("paused"):
                resume = f"`gt mq resume {escape_line(rig)}` once fixed"
                out.append(f"    {styled(palette, 'paused')}: {escape_line(q['paused'])} ({resume})")
            for m in q["open"]:
                tries = f" (attempt {escape_line(m['attempts'])})" if m.get("attempts") else ""
                later = f" (superseded by {escape_line(m['superseded_by'])})" if m.get("superseded_by") else ""
                later += " (of the rig before it was removed)" if m.get("former_rig") else ""
                mr, status, bead = (escape_line(m[key]) for key in ("id", "status", "bead"))
                out.append(f"    {mr}  {styled(palette, status)}  {bead}{tries}{later}")

    out += ["", head("Convoys", "bold")]
    if snap["convoys"] is None:
        out.append(_missing("mayor"))
    elif not snap["convoys"]:
        out.append("  (no open convoys)")
    else:
        width = max(len(escape_line(c["id"])) for c in snap["convoys"])
        for c in snap["convoys"]:
            convoy, title = escape_line(c["id"]).ljust(width), escape_line(c["title"])
            out.append(f"  {convoy}  {progress_bar(c['closed'], c['total'], palette)}  {title}")

    out += ["", head("Escalations", "bold")]
    if snap["escalations"] is None:
        out.append(_missing("mayor"))
    elif not snap["escalations"]:
        out.append("  (none open)")
    else:
        rows = [
            [e["id"], _state_cell(e["severity"]), e["status"], e["bead"] or "-", human_age(e["age_s"]), _first_line(e)]
            for e in snap["escalations"]
        ]
        out += _table(("ID", "SEVERITY", "STATUS", "BEAD", "AGE", "MESSAGE"), rows, palette)
    return "\n".join(out)
