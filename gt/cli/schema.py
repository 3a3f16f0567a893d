"""``gt schema``: JSON Schema of the envelope, every command body and every event payload."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.core.subjects import event_subject
from shared.model.commands import COMMANDS
from shared.model.events import REGISTRY, Envelope


def all_schemas() -> dict[str, Any]:
    commands = {subject: msgspec.json.schema(cls) for subject, cls in sorted(COMMANDS.items())}
    events = {
        type_: {"v": cls.VERSION, "subject": event_subject(cls.AGGREGATE, "<id>"), "data": msgspec.json.schema(cls)}
        for type_, cls in sorted(REGISTRY.classes().items())
    }
    return {"envelope": msgspec.json.schema(Envelope), "commands": commands, "events": events}
