"""Golden event logs: logs stored by earlier versions must still fold into the same projection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.mayor.projection import new_projection

EVENTS = Path(__file__).parent.parent / "fixtures" / "events"


@pytest.mark.parametrize("name", ["beads_v1", "work_v1"])
def test_a_golden_log_folds_into_the_recorded_state(name: str) -> None:
    projection = new_projection()
    for line in (EVENTS / f"{name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        projection.apply(record["seq"], record["subject"], json.dumps(record["data"]).encode())
    assert projection.skipped == 0
    assert projection.fold_errors == 0
    expected = json.loads((EVENTS / f"{name}.expected.json").read_text())
    assert json.loads(projection.serialize_state()) == expected
