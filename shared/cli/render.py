"""Plain-text rendering for the CLI (``--json`` prints the data as it came)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import msgspec

_JSON = msgspec.json.Encoder()


def print_json(value: Any, out: TextIO = sys.stdout) -> None:
    out.write(msgspec.json.format(_JSON.encode(value), indent=2).decode() + "\n")


def _short_ts(value: str | None) -> str:
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def bead_detail(bead: dict[str, Any]) -> str:
    lines = [
        f"{bead['id']}  {bead['title']}",
        f"  status:    {bead['status']}",
        f"  type:      {bead['type']}    priority: P{bead['priority']}",
    ]
    if bead.get("assignee"):
        lines.append(f"  assignee:  {bead['assignee']}")
    if bead.get("parent"):
        lines.append(f"  parent:    {bead['parent']}")
    if bead.get("needs"):
        lines.append(f"  needs:     {', '.join(bead['needs'])}")
    if bead.get("labels"):
        lines.append(f"  labels:    {', '.join(bead['labels'])}")
    for key, value in sorted((bead.get("metadata") or {}).items()):
        lines.append(f"  meta:      {key}={value}")
    lines.append(f"  created:   {_short_ts(bead.get('created_at'))}")
    if bead.get("closed_at"):
        reason = f" ({bead['close_reason']})" if bead.get("close_reason") else ""
        lines.append(f"  closed:    {_short_ts(bead['closed_at'])}{reason}")
    if bead.get("description"):
        lines.append("")
        lines.extend(f"  {line}" for line in bead["description"].splitlines())
    return "\n".join(lines)


def bead_table(beads: list[dict[str, Any]]) -> str:
    if not beads:
        return "(no beads)"
    rows = [("ID", "STATUS", "PRI", "TYPE", "ASSIGNEE", "TITLE")]
    rows += [
        (b["id"], b["status"], f"P{b['priority']}", b["type"], b.get("assignee") or "-", b["title"]) for b in beads
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5] for row in rows)


def history_lines(entries: list[Any]) -> str:
    out = []
    for e in entries:
        detail = {k: v for k, v in e.data.items() if k != "bead_id" and v not in ([], {}, None, "")}
        fields = " ".join(f"{k}={v}" for k, v in detail.items())
        out.append(f"#{e.seq:<8} {_short_ts(e.ts)}  {e.type:<14} by {e.actor:<20} {fields}".rstrip())
    return "\n".join(out)
