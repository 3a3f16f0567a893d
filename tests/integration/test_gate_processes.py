"""A gate never outlives its refinery: it runs under a watcher that stops its whole process group when the
refinery goes away (or times it out), and a refinery starting stops what a gate whose watcher died as well left
running, verified by process group and identity, never touching a process that merely has a recorded pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from shared.host import processes
from shared.host.gates import runs
from shared.host.gates.records import GateRecord, Leader, WatchSpec
from shared.host.gates.watch import MARKER_VARIABLE
from tests.helpers import assert_eventually


def _child_of(evidence: Path) -> processes.ProcessRef | None:
    """The gate's child the gate recorded; None when it is gone already (it recorded its pid, so it ran)."""
    text = (evidence / "child").read_text().strip() if (evidence / "child").exists() else ""
    assert text, "the gate has not recorded its child"
    return processes.ref_of(int(text))


def _gone(child: processes.ProcessRef | None) -> bool:
    return child is None or not processes.is_alive(child)


def test_a_gate_past_its_time_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    script = f'(sleep 60; touch "{tmp_path}/late") & echo $! > "{tmp_path}/child"; wait'
    with (tmp_path / "gate.log").open("wb") as out:
        code = runs.run(
            ["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, out=out, timeout=1.0,
            records=tmp_path / "gates",
        )  # fmt: skip
    assert code is None, "a gate past its time-out has no exit code of its own"
    child = _child_of(tmp_path)
    assert _gone(child), "the gate's background child outlived its time-out"
    assert not list((tmp_path / "gates").glob("*")), "the record of a finished gate is left"


def test_a_gate_that_ends_leaves_nothing_running_and_gives_its_exit_code(tmp_path: Path) -> None:
    script = f'sleep 60 & echo $! > "{tmp_path}/child"; exit 3'
    with (tmp_path / "gate.log").open("wb") as out:
        code = runs.run(
            ["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, out=out, timeout=60,
            records=tmp_path / "gates",
        )  # fmt: skip
    assert code == 3
    child = _child_of(tmp_path)
    assert _gone(child), "what a gate left running in its group outlived it"


def test_a_gate_process_that_left_its_group_is_stopped_with_the_gate(tmp_path: Path) -> None:
    # A gate runs the change's own code: a process of it may leave the gate's process group and session (setsid,
    # a double fork) to outlive it, and meddle with the gates after it.
    script = (
        f'setsid sh -c \'(trap "" TERM HUP; sleep 6; touch "{tmp_path}/late") & echo $! > "{tmp_path}/child"\' '
        f"& sleep 1; exit 0"
    )
    with (tmp_path / "gate.log").open("wb") as out:
        code = runs.run(
            ["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, out=out, timeout=60,
            records=tmp_path / "gates",
        )  # fmt: skip
    assert code == 0
    child = _child_of(tmp_path)
    assert _gone(child), "a gate's process that left its group outlived the gate"


async def test_a_gate_whose_watcher_was_killed_too_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    records = tmp_path / "gates"
    records.mkdir()
    marker = "m" * 32
    script = f'(sleep 60; touch "{tmp_path}/late") & echo $! > "{tmp_path}/child"; wait'
    spec = WatchSpec(argv=["sh", "-c", script], cwd=str(tmp_path), record=str(records / "g.json"), marker=marker)
    env = {"PATH": os.environ["PATH"], MARKER_VARIABLE: marker}
    watcher = subprocess.Popen(
        [sys.executable, "-I", "-S", runs.WATCHER, msgspec.json.encode(spec).decode()],
        cwd="/", env=env, stdin=subprocess.PIPE,
    )  # fmt: skip
    try:

        def recorded() -> GateRecord:
            assert (records / "g.json").exists(), "the watcher has not recorded the gate yet"
            return msgspec.json.decode((records / "g.json").read_bytes(), type=GateRecord)

        record = await assert_eventually(recorded, timeout=30)
        child = await assert_eventually(lambda: _child_of(tmp_path), timeout=30)
        assert child is not None, "the gate's child ended on its own"
        watcher.kill()  # the watcher dies with the refinery (its whole process group killed, say)
        watcher.wait()
        leader = processes.ProcessRef(pid=record.leader.pid, started=record.leader.started)
        assert processes.is_alive(leader), "the gate runs on, orphaned"
        assert processes.is_alive(child), "the gate runs on, orphaned"
        stopped = runs.stop_leftovers(records)
        assert {record.leader.pid, child.pid} <= set(stopped), stopped
        assert not processes.is_alive(leader)
        assert not processes.is_alive(child)
        assert not (records / "g.json").exists(), "the record of a stopped gate is left"
    finally:
        if watcher.stdin is not None:
            watcher.stdin.close()


def test_a_record_naming_a_group_that_is_not_the_gates_stops_nothing(tmp_path: Path) -> None:
    """A pid taken by an unrelated process (another start time, no marker) is never signalled."""
    records = tmp_path / "gates"
    records.mkdir()
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ref = processes.ref_of(other.pid)
        assert ref is not None
        stale = GateRecord(leader=Leader(pid=other.pid, started=ref.started - 100), marker="gone")
        (records / "old.json").write_bytes(msgspec.json.encode(stale))
        assert runs.stop_leftovers(records) == []
        assert processes.is_alive(ref), "an unrelated process with the recorded pid was stopped"
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
