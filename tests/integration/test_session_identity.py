"""Per-session NATS identities (issue 20, points 4 and 5) on a real nats-server with the shipped accounts file:
each polecat session logs in as itself through the auth callout and may use its own command subjects, its own
KV keys and its own inbox, nothing of another session's; no user reads another's inbox."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.witness.service import WitnessService
from shared.bus.auth_callout import AUTH_SUBJECT
from shared.bus.connection import close_quietly, connect
from shared.bus.kv import Bucket
from shared.bus.permissions import guarded
from shared.bus.topology import provision
from shared.core import ids, subjects
from shared.core.errors import NatsUnavailableError, PermissionDeniedError
from shared.core.ids import hook_lease_name
from shared.core.subjects import SessionOrigin, session_command_subject
from shared.model.session_identity import AGENT_COMMANDS
from tests.helpers import assert_eventually
from tests.secured_town import SecuredTown, responder_for, services_as_themselves

A = SessionOrigin("demo", "ace", "hq-aaaaaa-1")
B = SessionOrigin("demo", "bob", "hq-bbbbbb-1")
BEAD_A, BEAD_B = "hq-aaaaaa", "hq-bbbbbb"


@contextlib.asynccontextmanager
async def provisioned_town(st: SecuredTown) -> AsyncIterator[Client]:
    """The streams and buckets, made by a service (as the services do at start); its connection."""
    mayor = await st.connect("mayor")
    try:
        await provision(mayor, st.config("mayor"))
        yield mayor
    finally:
        await close_quietly(mayor)


async def denied(nc: Client, op: object, subject: str) -> None:
    """``op`` (a coroutine) is refused at once, for ``subject`` (nats-py lowercases the server's message)."""
    with pytest.raises(PermissionDeniedError) as caught:
        await asyncio.wait_for(guarded(nc, op), 10)  # type: ignore[arg-type]
    assert caught.value.subject.lower() == subject.lower(), caught.value


async def stored(bucket: Bucket, key: str) -> bytes | None:
    """The key's value as the bucket holds it (None: not there)."""
    entry = await bucket.get(key)
    return entry.value if entry is not None else None


async def allowed(nc: Client, op: object) -> object:
    return await asyncio.wait_for(guarded(nc, op), 10)  # type: ignore[arg-type]


async def test_a_session_may_use_its_own_subjects_keys_and_inbox_and_nothing_of_anothers(st: SecuredTown) -> None:
    async with provisioned_town(st) as mayor, responder_for(st, lambda s: s in {A.session, B.session}):
        # Something to read in the log, and a service answering a query.
        await mayor.jetstream().publish("gt.evt.test.one", b"{}", stream="GT_EVT")
        own_outcome = subjects.outcome_subject(ids.session_scoped_id(A.session, "cli-1"))
        await mayor.jetstream().publish(own_outcome, b'{"outcome": 1}', stream="GT_EVT")
        others = (
            "gt.evt.cmd.cli-2",  # the operator's
            subjects.outcome_subject(ids.session_scoped_id(B.session, "cli-3")),  # another session's
        )
        for other in others:
            await mayor.jetstream().publish(other, b'{"outcome": "not yours"}', stream="GT_EVT")
        await mayor.jetstream().publish(f"gt.evt.lease.{hook_lease_name(BEAD_A)}", b"{}", stream="GT_EVT")
        await mayor.jetstream().publish(f"gt.evt.lease.{hook_lease_name(BEAD_B)}", b"{}", stream="GT_EVT")

        async def echo(msg: Msg) -> None:
            await msg.respond(b"pong")

        await mayor.subscribe("gt.q.mayor.echo", cb=echo)
        await mayor.flush()
        b_nc = await connect(st.session_config(B, BEAD_B), name="session-b")
        await Bucket(b_nc, "GT_HEARTBEATS", keys_only=True).put(B.session, b"B's beat")
        await Bucket(b_nc, "GT_LEASES", keys_only=True).put(hook_lease_name(BEAD_B), b"B's lease")

        nc = await connect(st.session_config(A, BEAD_A), name="session-a")
        js = nc.jetstream()
        try:
            # Its own: every agent command on its own subject, a query through its own inbox, its heartbeat and
            # its bead's lease (put and get).
            for aggregate, verb in AGENT_COMMANDS:
                await allowed(nc, nc.publish(session_command_subject(aggregate, verb, A), b"{}"))
            answer = await allowed(nc, nc.request("gt.q.mayor.echo", b"ping", timeout=10))
            assert isinstance(answer, Msg)
            assert answer.data == b"pong"
            assert answer.subject.startswith("_INBOX_s-hq-aaaaaa-1.")
            beats = Bucket(nc, "GT_HEARTBEATS", keys_only=True)
            lease = Bucket(nc, "GT_LEASES", keys_only=True)
            await allowed(nc, beats.put(A.session, b"A's beat"))
            assert (await allowed(nc, beats.get(A.session))).value == b"A's beat"  # type: ignore[attr-defined]
            await allowed(nc, lease.put(hook_lease_name(BEAD_A), b"A's lease"))
            assert (await allowed(nc, lease.get(hook_lease_name(BEAD_A)))).value == b"A's lease"  # type: ignore[attr-defined]
            # Of the log: its own command's outcome and its own lease's newest event, each by a direct get naming
            # it.
            outcome = await allowed(nc, js.get_last_msg("GT_EVT", own_outcome, direct=True))
            assert outcome.data == b'{"outcome": 1}'  # type: ignore[attr-defined]
            own_lease = await allowed(
                nc, js.get_last_msg("GT_EVT", f"gt.evt.lease.{hook_lease_name(BEAD_A)}", direct=True)
            )
            assert own_lease.data == b"{}"  # type: ignore[attr-defined]

            # Another's, or anyone's: refused, each at once and by name.
            await denied(
                nc,
                nc.publish(session_command_subject("step", "done", B), b"{}"),
                "gt.cmd.step.done.demo.bob.hq-bbbbbb-1",
            )
            await denied(nc, nc.publish("gt.cmd.step.done", b"{}"), "gt.cmd.step.done")
            await denied(nc, nc.publish("gt.cmd.bead.close", b"{}"), "gt.cmd.bead.close")
            for inbox in ("_INBOX.>", "_INBOX_s-hq-bbbbbb-1.>", "_INBOX_operator.>", ">", "gt.cmd.>"):
                await denied(nc, nc.subscribe(inbox), inbox)
            await denied(nc, beats.put(B.session, b"forged"), f"$KV.GT_HEARTBEATS.{B.session}")
            other_lease = f"$KV.GT_LEASES.{hook_lease_name(BEAD_B)}"
            await denied(nc, lease.put(hook_lease_name(BEAD_B), b"forged"), other_lease)
            await denied(nc, lease.get(hook_lease_name(BEAD_B)), f"$JS.API.DIRECT.GET.KV_GT_LEASES.{other_lease}")
            body = json.dumps({"last_by_subj": other_lease}).encode()
            await denied(nc, nc.request("$JS.API.DIRECT.GET.KV_GT_LEASES", body), "$JS.API.DIRECT.GET.KV_GT_LEASES")
            await denied(
                nc, nc.request("$JS.API.STREAM.MSG.GET.KV_GT_LEASES", body), "$JS.API.STREAM.MSG.GET.KV_GT_LEASES"
            )
            await denied(nc, js.purge_stream("KV_GT_LEASES"), "$JS.API.STREAM.PURGE.KV_GT_LEASES")
            await denied(nc, js.purge_stream("KV_GT_HEARTBEATS"), "$JS.API.STREAM.PURGE.KV_GT_HEARTBEATS")
            await denied(nc, js.key_value("GT_LEASES"), "$JS.API.STREAM.INFO.KV_GT_LEASES")  # would list every key
            # The rest of the log: no stream info (it lists every subject), no consumer (its deliver subject may
            # name any subject), no message get or bare direct get (their body names any subject), no other
            # subject's direct get (another lease's events, a bead's).
            await denied(nc, js.stream_info("GT_EVT"), "$JS.API.STREAM.INFO.GT_EVT")
            await denied(
                nc, js.subscribe("gt.evt.>", stream="GT_EVT", ordered_consumer=True), "$JS.API.CONSUMER.CREATE.GT_EVT"
            )
            last_of = json.dumps({"last_by_subj": "gt.evt.test.one"}).encode()
            await denied(nc, nc.request("$JS.API.STREAM.MSG.GET.GT_EVT", last_of), "$JS.API.STREAM.MSG.GET.GT_EVT")
            await denied(nc, nc.request("$JS.API.DIRECT.GET.GT_EVT", last_of), "$JS.API.DIRECT.GET.GT_EVT")
            # Nor another sender's outcome: not by its id, nor by a wildcard the server would resolve to the newest
            # outcome of anyone's (a red team read every outcome so, when a session's permission was `cmd.*`).
            wildcards = ("gt.evt.cmd.*", "gt.evt.cmd.>", "gt.evt.cmd.*.*", f"gt.evt.cmd.{B.session}.*")
            for subject in ("gt.evt.test.one", f"gt.evt.lease.{hook_lease_name(BEAD_B)}", *others, *wildcards):
                await denied(
                    nc, js.get_last_msg("GT_EVT", subject, direct=True), f"$JS.API.DIRECT.GET.GT_EVT.{subject}"
                )
            # A rollup on its own key would wipe the bucket: the bucket refuses rollups (permissions cannot).
            with pytest.raises(nats.js.errors.APIError):
                await js.publish(
                    f"$KV.GT_LEASES.{hook_lease_name(BEAD_A)}",
                    b"",
                    headers={"KV-Operation": "PURGE", "Nats-Rollup": "all"},
                )
        finally:
            await close_quietly(nc)
        # B's keys are as B wrote them.
        assert await stored(Bucket(b_nc, "GT_HEARTBEATS", keys_only=True), B.session) == b"B's beat"
        assert await stored(Bucket(b_nc, "GT_LEASES", keys_only=True), hook_lease_name(BEAD_B)) == b"B's lease"
        await close_quietly(b_nc)
    lines = [line for line in st.violations() if '"AGENTS/user:hq-aaaaaa-1"' in line]
    assert any('Subject "gt.cmd.step.done.demo.bob.hq-bbbbbb-1"' in line for line in lines), lines


async def test_a_wrong_expired_or_ended_sessions_credential_cannot_log_in(st: SecuredTown) -> None:
    live = {A.session}
    async with provisioned_town(st), responder_for(st, lambda s: s in live) as responder:
        good = st.session_config(A, BEAD_A)
        nc = await connect(good, name="session-a")
        await close_quietly(nc)

        password = good.nats_password or ""
        wrong = msgspec.structs.replace(good, nats_password=password[:-1] + ("1" if password.endswith("0") else "0"))
        another_session = msgspec.structs.replace(good, nats_user=B.session)  # A's password as B's
        expired = st.session_config(A, BEAD_A, expires_in_s=-1)
        for config in (wrong, another_session, expired):
            with pytest.raises(NatsUnavailableError) as caught:
                await connect(config, name="refused")
            assert caught.value.refused, caught.value
        live.clear()  # the session ended
        with pytest.raises(NatsUnavailableError) as caught:
            await connect(good, name="ended")
        assert caught.value.refused
        assert responder.granted == 1
        assert responder.refused >= 4  # nats-py tries each login more than once
    log = st.server.log_file.read_text()
    assert f"session {A.session} unknown, ended or expired" in log
    assert f"the credential of session {A.session} expired" in log
    assert "not one the witness minted" in log


GARBAGE_LOGINS = [
    ("", ""),
    (">", "v1.>.*.x.1.00"),
    ("hq-aaaaaa-1", ""),
    ("hq-aaaaaa-1", "v1.demo.ace.hq-aaaaaa.99999999999999999999.00"),
    ("hq-aaaaaa-1", "v1.demo.ace.hq-aaaaaa.-1.00"),
    ("hq-aaaaaa-1", "v1." + "x" * 60_000),
    ("hq-aaaaaa-1", "v1.d\u00e9mo.ace.hq-aaaaaa.1.\u00ff\u00fe"),
    ("x" * 10_000, "y"),
    ("hq-aaaaaa-1", "v1.demo.ace.hq-aaaaaa.1." + "[" * 1000),
    # The mayor agent's shape, forged or for an agent that does not run.
    ("agent-mayor", "a1.mayor.1.99999999999.00"),
    ("agent-mayor", "a1.mayor.-1.1.00"),
    ("agent-deputy", "a1.deputy.1.99999999999.00"),
]


async def test_the_responder_survives_garbage_logins_and_still_answers(st: SecuredTown) -> None:
    async with provisioned_town(st), responder_for(st, lambda s: s == A.session) as responder:
        for user, password in GARBAGE_LOGINS:
            config = msgspec.structs.replace(st.session_config(A, BEAD_A), nats_user=user, nats_password=password)
            with pytest.raises(NatsUnavailableError):
                await connect(config, name="garbage")
        nc = await connect(st.session_config(A, BEAD_A), name="still-answered")
        try:
            # Nobody but the server may ask the responder anything: not even a forged request gets there.
            await denied(nc, nc.publish(AUTH_SUBJECT, b"{}"), AUTH_SUBJECT)
        finally:
            await close_quietly(nc)
        assert responder.granted == 1
        assert responder.refused >= len(GARBAGE_LOGINS)


@pytest.mark.parametrize("user", ["operator", "plugin", "mayor", "witness", "refinery", "deacon"])
async def test_no_user_may_read_anothers_inbox(st: SecuredTown, user: str) -> None:
    nc = await st.connect(user)
    try:
        assert nc._inbox_prefix == f"_INBOX_{user}".encode()  # what nats-py takes its inboxes from
        await denied(nc, nc.subscribe("_INBOX.>"), "_INBOX.>")
        await denied(nc, nc.subscribe("_INBOX_s-hq-aaaaaa-1.>"), "_INBOX_s-hq-aaaaaa-1.>")
        other = "_INBOX_plugin.>" if user != "plugin" else "_INBOX_operator.>"
        await denied(nc, nc.subscribe(other), other)
    finally:
        await close_quietly(nc)


async def test_the_operator_still_sends_commands_and_queries_through_its_own_inbox(
    st: SecuredTown, tmp_path: Path
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor"):
        created = await st.gt("operator", "bead", "create", "Through my own inbox", "--wait")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        shown = await st.gt("operator", "bead", "show", bead, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["title"] == "Through my own inbox"
        plugin_status = await st.gt("plugin", "bead", "show", bead, "--json")  # a query, as the plugin user
        assert plugin_status.returncode == 0, plugin_status.stderr
    assert st.violations() == []


# ---- the witness mints each session's identity and vouches for it while the session lives ---------------


AS_ITSELF = """\
out="$GT_WORKTREE/../$GT_SESSION"
cp "$NATS_PASSWORD_FILE" "$out.password"
env > "$out.env"
gt heartbeat --note "as myself" > "$out.heartbeat" 2>&1; echo "exit $?" >> "$out.heartbeat"
sleep 600
"""
"""An agent that keeps a copy of its credential (to try it once the session has ended), beats once, waits."""


# The kicked connection keeps trying to reconnect and is refused each time; nats-py leaves the socket of a
# refused reconnect attempt to the garbage collector, whose ResourceWarning would otherwise fail the test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_the_witness_gives_each_session_its_own_identity_and_refuses_it_once_the_session_ended(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in st.witness_env().items():
        monkeypatch.setenv(key, value)
    script = tmp_path / "as-itself.sh"
    script.write_text(AS_ITSELF)
    async with services_as_themselves(st, tmp_path, "mayor", "witness") as town:
        added = await st.gt("operator", "rig", "add", "demo", str(town.origin), "--agent", f"sh {script}")
        assert added.returncode == 0, added.stderr
        created = await st.gt("operator", "bead", "create", "Be yourself")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        assert (await st.gt("operator", "sling", bead, "demo")).returncode == 0

        def started() -> str:
            sessions = town.sessions_of(bead)
            assert sessions, "no session yet"
            assert sessions[0].status == "started"
            return sessions[0].id

        session: str = await assert_eventually(started, timeout=60, interval=0.1)
        out = Path(town.sessions_of(bead)[0].worktree).parent / session

        def beat() -> str:
            written = out.parent / f"{session}.heartbeat"
            assert written.exists(), "the agent has not written its heartbeat's result yet"
            text = written.read_text()
            assert "exit" in text
            return text

        said = await assert_eventually(beat, timeout=60, interval=0.2)
        assert said.strip().endswith("exit 0"), said
        dumped = (out.parent / f"{session}.env").read_text().splitlines()
        env = dict(line.split("=", 1) for line in dumped if "=" in line)
        assert env["NATS_USER"] == session
        assert env["NATS_INBOX_PREFIX"] == f"_INBOX_s-{session}"
        assert "NATS_PASSWORD" not in env
        password = (out.parent / f"{session}.password").read_text().strip()
        assert password not in env.values()
        assert not [key for key in env if key.startswith(("GT_AUTH_", "GT_SESSION_KEY", "GT_NATS_"))]
        beats = Bucket(town.nc, "GT_HEARTBEATS", keys_only=True)
        assert json.loads(await stored(beats, session) or b"{}")["note"] == "as myself"
        assert town.witness is not None
        witness = town.witness
        assert isinstance(witness, WitnessService)
        assert witness.responder is not None
        assert witness.responder.granted >= 1

        own = st.session_config(SessionOrigin("demo", "ace", session), bead)
        own = msgspec.structs.replace(own, nats_password=password)
        survivor = await connect(own, name="while-live")  # the session's credential, while it lives
        try:
            closed = await st.gt("operator", "bead", "close", bead, "--reason", "enough")
            assert closed.returncode == 0, closed.stderr
            await town.wait_settled(bead, timeout=90)
            with pytest.raises(NatsUnavailableError) as caught:
                await connect(own, name="after-the-end")
            assert caught.value.refused
            # A connection of the session still open when it ended (a process that outlived its pane): cut.
            await assert_eventually(lambda: not survivor.is_connected, timeout=30, message="the survivor is cut")
            # Counted once the server answered the kick, which may come after the connection is cut.
            responder = witness.responder
            await assert_eventually(lambda: responder.kicked >= 1, timeout=30, message="the witness kicked it")
        finally:
            await close_quietly(survivor)
            gc.collect()  # the refused attempts' sockets go now, under this test's filters, not in a later test
    assert f"session {session} unknown, ended or expired" in st.server.log_file.read_text()


async def test_a_sessions_gt_waits_out_a_witness_restart_rather_than_failing(st: SecuredTown) -> None:
    # No responder yet (the witness is restarting): the session's logins are refused until it is back.
    async with provisioned_town(st) as mayor:
        beating = asyncio.ensure_future(st.gt_in_session(A, BEAD_A, "heartbeat", "--note", "patient"))

        def refused_a_few_times() -> bool:
            assert not beating.done(), f"it gave up: {beating.result()}"
            return st.server.log_file.read_text().count(f'authentication error - User "{A.session}"') >= 5

        # More refusals than a plain `gt` tries (2 connects, each trying the server twice), each after the
        # server's 2 s wait for an answer: its session's `gt` is still trying.
        await assert_eventually(refused_a_few_times, timeout=28, interval=0.1, message="refused, still trying")
        async with responder_for(st, lambda s: s == A.session):
            done = await asyncio.wait_for(beating, 60)
        assert done.returncode == 0, done.stderr
        beat = await stored(Bucket(mayor, "GT_HEARTBEATS", keys_only=True), A.session)
        assert json.loads(beat or b"{}")["note"] == "patient"


async def test_a_sessions_gt_waits_out_its_nats_server_restarting(st: SecuredTown, tmp_path: Path) -> None:
    # Its login gets no answer at all (the server is down; or, on a loaded machine, the server's 2 s wait for the
    # auth callout outlasts the client's connect timeout): a session's `gt` keeps trying, as for a refusal.
    async with provisioned_town(st), responder_for(st, lambda s: s == A.session):
        pass
    st.server.stop()
    stderr = tmp_path / "gt.stderr"
    with stderr.open("w") as err:
        beating = subprocess.Popen(
            [sys.executable, "-m", "gt.cli.main", "heartbeat", "--note", "after the restart"],
            env=st.session_env(A, BEAD_A),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:

        def tried_twice() -> bool:
            assert beating.poll() is None, f"it gave up: {stderr.read_text()}"
            return stderr.read_text().count("nats_connect_retry") >= 2  # one per login attempt it made

        await assert_eventually(tried_twice, timeout=25, interval=0.1, message="still trying while the server is down")
        st.server.start()
        async with provisioned_town(st) as mayor, responder_for(st, lambda s: s == A.session):
            code = await asyncio.to_thread(beating.wait, 60)
            assert code == 0, stderr.read_text()
            beat = await stored(Bucket(mayor, "GT_HEARTBEATS", keys_only=True), A.session)
            assert json.loads(beat or b"{}")["note"] == "after the restart"
    finally:
        if beating.poll() is None:
            beating.kill()
            beating.wait()
