"""The docker-compose stack (three clustered NATS nodes, the four services with their own users, two gate runners)
survives the kill -9 of a NATS node mid-workload: every bead finishes once, its gates run on the runner containers,
nothing is lost or duplicated, and the node rejoins and catches up. Runs in Docker through testcontainers when an
engine answers, else as local processes from the same compose file and configs (tests/compose_stack.py)."""

from __future__ import annotations

import functools
import json
import re
import secrets
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from shared.model.events import decode_envelope
from tests.compose_stack import (
    USERS,
    Operator,
    Stack,
    compose_config,
    nats_nodes,
    running_stack,
    town_services,
    write_env_file,
)
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually, connect_within
from tests.log_tools import outcomes, read_all

BEADS = 6
STEP_PAUSE_S = 2
"""Seconds each of a bead's six steps takes: a bead is under way at least 12 s."""


@pytest.fixture
def stack(tmp_path: Path, gt_env: dict[str, str]) -> Iterator[Stack]:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as running:
        yield running


@pytest.fixture
async def reader(stack: Stack) -> AsyncIterator[Client]:
    """The operator's own NATS connection, for reading the log."""
    nc = await connect_within(
        stack.urls(),
        user="operator",
        password=stack.passwords["operator"],
        inbox_prefix="_INBOX_operator",  # the only inbox the operator may read
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
    )
    try:
        yield nc
    finally:
        await nc.close()


async def log_of(nc: Client) -> list[tuple[int, str, dict[str, Any]]]:
    out = []
    for seq, subject, data in await read_all(nc, "GT_EVT"):
        env = decode_envelope(data)
        out.append((seq, env.type, {"subject": subject, **_json(env.data)}))
    return out


def _json(raw: bytes) -> dict[str, Any]:
    import msgspec

    decoded = msgspec.json.decode(raw)
    return decoded if isinstance(decoded, dict) else {}


def closed_beads(log: list[tuple[int, str, dict[str, Any]]]) -> Counter[str]:
    return Counter(data["subject"].rsplit(".", 1)[-1] for _, kind, data in log if kind == "bead.closed")


async def stream_leader(nc: Client, stream: str) -> str:
    info = await nc.jetstream().stream_info(stream)
    assert info.cluster is not None
    assert info.cluster.leader
    return str(info.cluster.leader)


LED_BY_VICTIM = ("GT_CMD", "KV_GT_ACTIVE")


async def move_leader(stack: Stack, stream: str, to: str) -> None:
    """Ask ``stream``'s leader to step down in favour of node ``to`` until ``to`` leads it. Sent as the
    deacon: the stream leader API is the services' (the operator may not move leaders)."""
    nc = await connect_within(
        stack.urls(), user="deacon", password=stack.passwords["deacon"], inbox_prefix="_INBOX_deacon"
    )
    try:

        async def leads() -> bool:
            if await stream_leader(nc, stream) == to:
                return True
            body = json.dumps({"placement": {"preferred": to}}).encode()
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)
            raise AssertionError(f"{to} does not lead {stream} yet")

        moved: bool = await assert_eventually(leads, timeout=60, interval=1)
        assert moved
    finally:
        await nc.close()


async def replicas_current(nc: Client, stream: str, nodes: list[str]) -> bool:
    info = await nc.jetstream().stream_info(stream)
    cluster = info.cluster
    if cluster is None or not cluster.leader:
        return False
    peers = {str(cluster.leader): True}
    for replica in cluster.replicas or []:
        peers[str(replica.name)] = bool(replica.current) and not replica.offline and int(replica.lag or 0) == 0
    return sorted(peers) == sorted(nodes) and all(peers.values())


@pytest.mark.compose_stack
@pytest.mark.timeout(900)
async def test_a_nats_node_killed_mid_workload_loses_and_duplicates_nothing_and_catches_up(
    stack: Stack, reader: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    gt = Operator(stack, gt_env, tmp_path / "operator")
    nodes = stack.node_names()
    assert len(nodes) == 3

    # The streams were provisioned by the services with three replicas, one on each node.
    for stream in ("GT_EVT", "GT_CMD"):
        info = await reader.jetstream().stream_info(stream)
        assert info.config.num_replicas == 3, stream
        current: bool = await assert_eventually(functools.partial(replicas_current, reader, stream, nodes), timeout=60)
        assert current

    # The hardest node to lose leads every stream the services write: the event log, the commands and the
    # activity keys (renewals then wait out an election of 4 to 9 s; the holders pause, and must resume). The
    # leaders are moved before the work starts: moved mid-workload (an election each), the last beads could merge
    # before the kill, and then nothing would be tested.
    victim = await stream_leader(reader, "GT_EVT")
    for stream in LED_BY_VICTIM:
        await move_leader(stack, stream, victim)

    origin = stack.make_origin()
    # Each step paused: a bead is under way at least 12 s, so the second three are when the first closes.
    agent = f"GT_AGENT_STEP_PAUSE={STEP_PAUSE_S} gt-agent"
    gt("rig", "add", "demo", origin, "--test", "git log -1 --oneline", "--max-polecats", "3", "--agent", agent)
    beads = [gt("bead", "create", f"Topology bead {i}") for i in range(BEADS)]
    for bead in beads:
        gt("sling", bead, "demo")

    # Mid-workload: some work merged, the rest under way. Kill the node leading the log (still: moved back if not).
    started: bool = await assert_eventually(lambda: _some_closed(reader), timeout=240, interval=0.5)
    assert started
    for stream in ("GT_EVT", *LED_BY_VICTIM):
        if await stream_leader(reader, stream) != victim:
            await move_leader(stack, stream, victim)
    stack.kill_node(victim)
    closed_now: Counter[str] = await assert_eventually(lambda: _closed(reader), timeout=60)
    closed_at_kill = sum(closed_now.values())
    assert closed_at_kill < BEADS, "the workload finished before the kill: nothing was tested"

    async def all_closed() -> bool:
        return set(await _closed(reader)) >= set(beads)

    try:
        finished: bool = await assert_eventually(all_closed, timeout=420, interval=1)
        assert finished
    except AssertionError:
        tails = "\n".join(f"--- {name}\n{stack.log_tail(name)}" for name in ("mayor", "witness", "refinery"))
        raise AssertionError(f"not every bead closed after {victim} was killed\n{tails}") from None
    # A new leader was elected among the two that were left.
    assert await stream_leader(reader, "GT_EVT") != victim

    # The node comes back and catches up: its own copy of the log has everything the others have.
    stack.start_node(victim)
    for stream in ("GT_EVT", "GT_CMD"):
        caught_up: bool = await assert_eventually(
            functools.partial(replicas_current, reader, stream, nodes), timeout=120, interval=0.5
        )
        assert caught_up
    last_seq = int((await reader.jetstream().stream_info("GT_EVT")).state.last_seq)

    def victim_has_it_all() -> bool:
        state = stack.node_stream_state(victim, "GT_EVT")
        return state is not None and int(state.get("last_seq", 0)) >= last_seq

    await assert_eventually(victim_has_it_all, timeout=60, interval=0.5)

    # Nothing lost or duplicated, read from the log alone.
    log = await log_of(reader)
    closed = closed_beads(log)
    assert {b: closed[b] for b in beads} == dict.fromkeys(beads, 1)
    merged_beads: Counter[str] = Counter()
    bead_of_mr = {d["mr_id"]: d["bead"] for _, kind, d in log if kind == "mr.submitted"}
    for _, kind, data in log:
        if kind == "mr.merged" and not data.get("already"):
            merged_beads[bead_of_mr[data["mr_id"]]] += 1
    assert {b: merged_beads[b] for b in beads} == dict.fromkeys(beads, 1)
    assert all(len(found) == 1 for found in (await outcomes(reader)).values())
    _assert_one_live_session_per_bead(log)
    _assert_gated_on_runners(log)
    files = stack.origin_files(origin, "main")
    for bead in beads:
        assert any(f.startswith(f".gastown-work/{bead}/") for f in files), bead


async def _closed(nc: Client) -> Counter[str]:
    try:
        return closed_beads(await log_of(nc))
    except (nats.errors.Error, TimeoutError) as exc:
        # While a node is down the client reconnects and a new stream leader is elected: ask again.
        raise AssertionError(f"the log cannot be read right now: {exc!r}") from exc


async def _some_closed(nc: Client) -> bool:
    return bool(await _closed(nc))


def _assert_gated_on_runners(log: list[tuple[int, str, dict[str, Any]]]) -> None:
    """Every merge's gates ran on the stack's runner containers (the refinery's GT_MQ_RUNNERS), each job answered once
    by the runner that took it last."""
    started = {data["job_id"]: data["runner"] for _, kind, data in log if kind == "gate.started"}
    finished = [data for _, kind, data in log if kind == "gate.finished"]
    assert started, "no gate job was started: the refinery ran its gates itself"
    assert set(started.values()) <= {"runner-1", "runner-2"}, started
    assert finished, "no gate job was answered"
    assert len({f["job_id"] for f in finished}) == len(finished), "one answer per job"
    assert all(f["runner"] == started[f["job_id"]] for f in finished), finished
    assert any(f["passed"] for f in finished), finished


def _assert_one_live_session_per_bead(log: list[tuple[int, str, dict[str, Any]]]) -> None:
    bead_of: dict[str, str] = {}
    live: dict[str, set[str]] = defaultdict(set)
    for seq, kind, data in log:
        if kind == "session.requested":
            bead_of[data["session_id"]] = data["bead"]
        elif kind == "session.started":
            bead = bead_of[data["session_id"]]
            live[bead].add(data["session_id"])
            assert len(live[bead]) == 1, f"bead {bead} had two live sessions at seq {seq}: {sorted(live[bead])}"
        elif kind == "session.ended":
            live[bead_of[data["session_id"]]].discard(data["session_id"])


def test_the_stack_runs_each_service_with_its_own_user_and_three_replicas(tmp_path: Path) -> None:
    env_file = write_env_file(tmp_path / "compose.env", {user: f"pw-{user}" for user in USERS})
    model = compose_config(REPO_ROOT, env_file)
    assert nats_nodes(model) == ["nats-1", "nats-2", "nats-3"]
    assert sorted(town_services(model)) == ["deacon", "mayor", "refinery", "runner-1", "runner-2", "witness"]
    volumes = {node: model["services"][node]["volumes"] for node in nats_nodes(model)}
    data_volumes = {str(v).split(":")[0] if isinstance(v, str) else v["source"] for vs in volumes.values() for v in vs}
    assert {"nats-1-data", "nats-2-data", "nats-3-data"} <= {Path(v).name for v in data_volumes}
    for service in town_services(model):
        env = model["services"][service]["environment"]
        user = "runner" if service.startswith("runner-") else service  # the runners share one user
        assert env["NATS_USER"] == user
        assert env["NATS_PASSWORD"] == f"pw-{user}"
        assert env["GT_REPLICAS"] == "3"
        assert env["NATS_URL"].count("nats://") == 3
        assert model["services"][service]["restart"] == "unless-stopped"
        assert model["services"][service]["healthcheck"]["test"][1:3] == ["gt", "health"]
    witness = model["services"]["witness"]["environment"]
    # Gates run as the image's user `gate`: the refinery runs as root for that, on a GT_HOME volume of its own.
    refinery = model["services"]["refinery"]
    assert refinery["environment"]["GT_GATE_USER"] == "gate"
    assert str(refinery["user"]).split(":")[0] == "0"
    assert refinery["environment"]["GT_HOME"] == "/var/lib/gastown-refinery"
    mounts = {str(v).split(":")[1] if isinstance(v, str) else v["target"] for v in refinery["volumes"]}
    assert {"/var/lib/gastown", "/var/lib/gastown-refinery"} <= mounts
    # ... on the two gate runners, which the refinery's gates go to: as `gate`, each runner root on a home volume of
    # its own, the rigs' repositories on gt-home read-only.
    assert refinery["environment"]["GT_MQ_RUNNERS"] == "2"
    for name in ("1", "2"):
        runner = model["services"][f"runner-{name}"]
        assert runner["command"] == ["gt-runner", "--log-json"]
        assert runner["environment"]["GT_RUNNER_NAME"] == name
        assert runner["environment"]["GT_GATE_USER"] == "gate"
        assert runner["environment"]["GT_HOME"] == "/var/lib/gastown-runner"
        assert str(runner["user"]).split(":")[0] == "0"
        assert runner["healthcheck"]["test"][1:] == ["gt", "health", f"runner-{name}"]
        assert sorted(str(v) for v in runner["volumes"]) == [
            "gt-home:/var/lib/gastown:ro",
            f"runner-{name}-home:/var/lib/gastown-runner:rw",
        ]
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert "useradd --system --no-create-home --shell /usr/sbin/nologin --uid 10002 gate" in dockerfile
    # Agents run as the image's user `agent`: the witness runs as root for that.
    assert "useradd --system --no-create-home --shell /bin/sh --uid 10003 agent" in dockerfile
    assert witness["GT_AGENT_USER"] == "agent"
    assert str(model["services"]["witness"]["user"]).split(":")[0] == "0"
    # Sessions get their own identities: the witness mints them and answers the auth callout as the auth user.
    assert not [key for key in witness if key.startswith("GT_AGENT_NATS_")]
    assert witness["GT_NATS_AUTH_PASSWORD"] == "pw-auth"
    assert witness["GT_NATS_SYS_PASSWORD"] == "pw-sys"
    assert witness["GT_AUTH_ISSUER_SEED"].startswith("SA")
    assert len(witness["GT_SESSION_KEY"]) >= 16
    for node in nats_nodes(model):
        node_env = model["services"][node]["environment"]
        assert node_env["GT_AUTH_ISSUER"].startswith("A")
        assert "GT_AUTH_ISSUER_SEED" not in node_env, "the seed stays with the witness"


COMMANDS_PER_NODE = 20


@pytest.mark.compose_stack
@pytest.mark.timeout(900)
async def test_operator_commands_all_get_their_outcome_while_any_one_nats_node_is_down(
    stack: Stack, reader: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Found running the compose stack as a new user: with one of the three nodes killed, `gt bead create` exited 3
    in 3-7 of every 12 tries, whichever node it was. Each command opened an ordered consumer on GT_EVT for its
    outcome, and some were placed on the dead peer. Outcomes are read with direct gets, which any replica answers.
    Each node is killed in turn, a bead slung to a rig on the gt-home volume just before; commands go out at once
    after the kill (through the election) and while it is down: every one must be answered, once, and every
    slung bead merges, once."""
    gt = Operator(stack, gt_env, tmp_path / "operator")
    nodes = stack.node_names()
    # A rig on the gt-home volume whose agent takes a while: at each kill a slung bead is under way.
    origin = stack.make_origin()
    gt("rig", "add", "demo", origin, "--test", "git log -1 --oneline", "--agent", "GT_AGENT_STEP_PAUSE=1 gt-agent")
    created: list[str] = []
    slung: list[str] = []
    for victim in nodes:
        # "Any one node" down: the other two hold a current copy of every stream (the log, the commands, the
        # KV buckets), as they do once the node killed before has caught up.
        every: bool = await assert_eventually(
            functools.partial(_every_stream_current, reader, nodes), timeout=120, interval=0.5
        )
        assert every
        slung.append(gt("bead", "create", f"worked while {victim} is killed"))
        gt("sling", slung[-1], "demo")
        stack.kill_node(victim)
        for n in range(COMMANDS_PER_NODE):
            bead = gt("bead", "create", f"sent while {victim} is down ({n})")
            assert re.fullmatch(r"hq-[0-9a-z]{6}", bead), f"with {victim} down: {bead}"
            created.append(bead)
        stack.start_node(victim)
    assert len(set(created)) == len(nodes) * COMMANDS_PER_NODE
    back: bool = await assert_eventually(functools.partial(_every_stream_current, reader, nodes), timeout=120)
    assert back

    async def all_slung_closed() -> bool:
        return set(await _closed(reader)) >= set(slung)

    merged: bool = await assert_eventually(all_slung_closed, timeout=300, interval=1)
    assert merged
    assert {bead: n for bead, n in (await _closed(reader)).items() if bead in slung} == dict.fromkeys(slung, 1)
    log = await log_of(reader)
    made = Counter(data["subject"].rsplit(".", 1)[-1] for _, kind, data in log if kind == "bead.created")
    assert {bead: made[bead] for bead in created} == dict.fromkeys(created, 1), "each stored once"
    assert all(len(found) == 1 for found in (await outcomes(reader)).values()), "each answered once"


async def _every_stream_current(nc: Client, nodes: list[str]) -> bool:
    """Every stream of the account has a current replica on each node; asked again while the reader reconnects
    (it may have been on the node killed)."""
    try:
        streams = [info.config.name for info in await nc.jetstream().streams_info()]
        behind = [name for name in streams if name and not await replicas_current(nc, name, nodes)]
    except (nats.errors.Error, TimeoutError) as exc:
        raise AssertionError(f"the streams' info cannot be read right now: {exc!r}") from exc
    assert streams, "no streams yet"
    assert not behind, f"not current on every node yet: {behind}"
    return True
