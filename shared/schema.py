"""``gt schema``: JSON Schema of the envelope, every command body and every event payload."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.commands import COMMANDS
from shared.events import REGISTRY, Envelope
from shared.subjects import event_subject


def all_schemas() -> dict[str, Any]:
    commands = {subject: msgspec.json.schema(cls) for subject, cls in sorted(COMMANDS.items())}
    events = {
        type_: {"v": cls.VERSION, "subject": event_subject(cls.AGGREGATE, "<id>"), "data": msgspec.json.schema(cls)}
        for type_, cls in sorted(REGISTRY.classes().items())
    }
    return {"envelope": msgspec.json.schema(Envelope), "commands": commands, "events": events}
