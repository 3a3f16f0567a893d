"""``Service.status()``: a ``ServiceStatus`` subclass per service, whose JSON is what ``gt.q.<service>.status``
answered as a dict before (the base's fields, then the service's own, in that order)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.deacon.service import DeaconService
from services.mayor.service import MayorService
from services.refinery.service import RefineryService
from services.witness.service import WitnessService
from shared.core.config import TownConfig
from shared.model.queries import ServiceStatus
from shared.model.queries.deacon import DeaconStatus
from shared.model.queries.refinery import RefineryStatus
from shared.model.queries.witness import WitnessStatus
from shared.service import Service

BASE = list(ServiceStatus.__struct_fields__)


@pytest.mark.parametrize(
    ("service", "kind", "own"),
    [
        (MayorService, ServiceStatus, []),
        (WitnessService, WitnessStatus, ["actions_done", "tmux_socket", "rigs", "session_connections_kicked"]),
        (RefineryService, RefineryStatus, ["merged", "gate_seconds", "batch_size", "processing"]),
        (DeaconService, DeaconStatus, ["services", "gc_kv_purged", "automations", "automation_scan_errors"]),
    ],
)
def test_a_service_reports_its_own_status_after_the_common_one(
    tmp_path: Path, service: Callable[[TownConfig], Service[Any]], kind: type[ServiceStatus], own: list[str]
) -> None:
    built = service(TownConfig(gt_home=tmp_path))
    status = built.status()
    assert type(status) is kind
    shown = msgspec.json.decode(msgspec.json.encode(status))
    assert list(shown)[: len(BASE)] == BASE
    assert (shown["service"], shown["role"], shown["connected"]) == (built.name, "starting", False)
    assert set(own) <= set(list(shown)[len(BASE) :])


def test_the_deacon_reports_its_purged_entries_as_an_object() -> None:
    status = DeaconService(TownConfig()).status()
    assert status.gc_kv_purged == {"leases": 0, "heartbeats": 0, "services": 0}
