"""The helpers every projection's handlers are written with (shared/service/projection.py: touch, advance), a bead's
status rule (shared/model/events/beads.py: forward) and the one rig record the witness and the refinery keep
(shared/model/rigs.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from services.refinery.projection import new_projection as new_refinery_projection
from services.witness.projection import new_projection as new_witness_projection
from shared.model.events import RigAdded, RigMassDeath, RigParked, RigRemoved, RigUnparked, RigUpdated
from shared.model.events.beads import BEAD_STATUSES, forward
from shared.model.fold import advance, touch
from tests.memory_log import MemoryLog

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class Thing(msgspec.Struct, kw_only=True):
    status: str = "queued"
    version: int = 0


def test_touch_moves_the_version_of_a_known_aggregate_only() -> None:
    things = {"a": Thing()}
    assert touch(things, "a", 7) is things["a"]
    assert things["a"].version == 7
    assert touch(things, "b", 8) is None
    assert things == {"a": Thing(version=7)}


def test_advance_moves_the_status_only_where_it_may_and_the_version_always() -> None:
    things = {"a": Thing()}
    assert advance(things, "a", 3, "done", only_from=("started",)) is None
    assert things["a"] == Thing(status="queued", version=3), "not from queued: the version moves all the same"
    assert advance(things, "a", 4, "started", only_from=("queued",)) is things["a"]
    assert things["a"] == Thing(status="started", version=4)
    assert advance(things, "a", 5, "started") is None, "already there"
    assert advance(things, "a", 6, "done") is things["a"]
    assert things["a"] == Thing(status="done", version=6)
    assert advance(things, "b", 7, "done") is None


def test_a_bead_only_moves_forward() -> None:
    """Sling (to hooked) and claim (to in progress) from every status a bead can have."""
    moved = {(status, to): forward(status, to) for status in BEAD_STATUSES for to in ("hooked", "in_progress")}
    assert moved == {
        ("open", "hooked"): "hooked",
        ("open", "in_progress"): "in_progress",
        ("hooked", "hooked"): "hooked",
        ("hooked", "in_progress"): "in_progress",
        ("in_progress", "hooked"): "in_progress",
        ("in_progress", "in_progress"): "in_progress",
        ("closed", "hooked"): "closed",
        ("closed", "in_progress"): "closed",
    }


def test_the_witness_and_the_refinery_keep_the_same_rig_record() -> None:
    log = MemoryLog()
    log.record(
        [
            RigAdded(rig="demo", repo="/r.git", prefix="demo", agent_command="a", test_command="make test"),
            RigAdded(rig="demo", repo="/other.git", prefix="other", agent_command="b"),
            RigUpdated(rig="demo", test_command="make check", max_polecats=2),
            RigParked(rig="demo", reason="CI down"),
            RigMassDeath(rig="demo", sessions=["s1", "s2"], window_s=60.0),
            RigRemoved(rig="demo"),
            RigUnparked(rig="demo"),
        ],
        ts=T0,
    )
    witness, refinery = new_witness_projection(), new_refinery_projection()
    log.replay(witness)
    log.replay(refinery)
    rig = witness.state.rigs["demo"]
    assert refinery.state.rigs == {"demo": rig}
    assert (rig.repo, rig.prefix, rig.test_command, rig.max_polecats) == ("/r.git", "demo", "make check", 2)
    assert (rig.parked, rig.parked_reason, rig.removed) == (True, "CI down", True), "a removed rig stays parked"
    assert rig.version == 7, "every event on the rig moves its version"
    assert witness.state.mass_deaths == {"demo": ["s1", "s2"]}


def test_gate_pristine_is_folded_from_added_and_updated_alike_by_the_witness_and_the_refinery() -> None:
    log = MemoryLog()
    log.record(
        [
            RigAdded(rig="fresh", repo="/f.git", prefix="fresh", agent_command="a", gate_pristine=True),
            RigAdded(rig="kept", repo="/k.git", prefix="kept", agent_command="a"),
            RigUpdated(rig="kept", gate_pristine=True),
            RigUpdated(rig="kept", max_polecats=2),
            RigUpdated(rig="fresh", gate_pristine=False),
        ],
        ts=T0,
    )
    witness, refinery = new_witness_projection(), new_refinery_projection()
    log.replay(witness)
    log.replay(refinery)
    assert refinery.state.rigs == witness.state.rigs
    rigs = witness.state.rigs
    assert (rigs["fresh"].gate_pristine, rigs["kept"].gate_pristine) == (False, True)
    assert rigs["kept"].max_polecats == 2, "an update that does not carry it leaves it"
