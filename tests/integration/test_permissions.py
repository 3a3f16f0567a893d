"""The shipped accounts (ops/nats/accounts.conf) on a real nats-server: each role does its work with its own
user, and nothing more. A refusal is visible (an error naming the user and the subject, the CLI's exit code 4,
the server's log) and changes nothing: the log, GT_CMD and the projections stay as they were."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog
from nats.aio.client import Client

from services.plugins.archive_files import read_archive
from services.plugins.archiver import ArchiverOptions, ArchiverPlugin
from services.plugins.metrics import collect_live
from shared.bus import commands as bus_commands
from shared.bus.connection import close_quietly, connect
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from shared.core.subjects import SessionOrigin
from shared.host import git
from shared.model.commands import MergeRequestDone
from shared.model.events import BeadClosed, Envelope, Event
from shared.plugins import Plugin, PluginSettings
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.secured_town import SecuredTown, denied_by_cli, refused, responder_for, services_as_themselves, snapshot
from tests.witness_town import TEST_COMMAND


async def test_every_role_does_its_work_with_its_own_user(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The witness's own credentials are in its environment too (as under docker-compose): no agent gets them.
    # It gives each session its own identity and answers the server's auth callout for it.
    for key, value in st.witness_env().items():
        monkeypatch.setenv(key, value)
    closings: list[str] = []

    async def on_event(seq: int, env: Envelope, payload: Event | None) -> None:
        if isinstance(payload, BeadClosed):
            async with counter.once(env.id) as claim:  # marks in GT_PLUGINS, as the plugin user
                if claim.first:
                    closings.append(payload.bead_id)

    counter = Plugin(st.config("plugin"), PluginSettings(name="closings", subjects=("gt.evt.bead.>",)), on_event)
    archive = tmp_path / "archive"
    archiver = ArchiverPlugin(st.config("plugin"), ArchiverOptions(directory=archive, fsync_interval_s=0.1))
    async with services_as_themselves(st, tmp_path, "mayor", "witness", "refinery", "deacon") as town:
        plugins = [asyncio.create_task(p.run()) for p in (counter, archiver)]
        try:
            await assert_eventually(lambda: counter.ready.is_set() and archiver.ready.is_set(), timeout=30)
            agent = 'env > "$GT_WORKTREE/../$GT_SESSION.env"; gt-agent'
            added = await st.gt(
                "operator", "rig", "add", "demo", str(town.origin), "--test", TEST_COMMAND, "--agent", agent
            )
            assert added.returncode == 0, added.stderr
            created = await st.gt("operator", "bead", "create", "Secure the town")
            assert created.returncode == 0, created.stderr
            bead = created.stdout.strip()
            slung = await st.gt("operator", "sling", bead, "demo")
            assert slung.returncode == 0, slung.stderr

            await town.wait_merge_requested(bead)
            sessions = await town.wait_settled(bead, timeout=90)
            assert [s.end_reason for s in sessions] == ["done"], "the agent finished as its own session identity"

            def closed() -> bool:
                assert town.mayor is not None
                return town.mayor.projection.state.beads[bead].status == "closed"

            await assert_eventually(closed, timeout=60, interval=0.1)  # the refinery merged it and closed it
            shown = await st.gt("operator", "bead", "show", bead, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["status"] == "closed"
            await assert_eventually(lambda: closings == [bead], timeout=30)

            nc = town.nc
            last = int((await nc.jetstream().stream_info("GT_EVT")).state.last_seq)

            def archived() -> bool:
                return [e.seq for e in read_archive(archive)] == list(range(1, last + 1))

            await assert_eventually(archived, timeout=30, message="the archiver holds every event of the log")

            # The metrics exporter's live facts, as the plugin user: stream info, service status, consumers.
            plugin_nc = await st.connect("plugin")
            try:
                live = await collect_live(
                    plugin_nc, "GT_EVT", ("mayor", "witness", "refinery", "deacon"),
                    timeout=2.0, skip_plugin="metrics",
                )  # fmt: skip
            finally:
                await close_quietly(plugin_nc)
            assert live.stream_last_seq is not None
            assert live.stream_last_seq >= last
            assert all(live.services.values()), live.services
            assert {"archiver", "closings"} <= set(live.plugins)
        finally:
            for plugin in (counter, archiver):
                await plugin.shutdown()
            await asyncio.wait_for(asyncio.gather(*plugins), 30)

    seen = agent_environment(sessions[0].worktree, sessions[0].id)
    assert seen.get("NATS_USER") == sessions[0].id, "the session logged in as itself"
    assert seen.get("NATS_INBOX_PREFIX") == f"_INBOX_s-{sessions[0].id}"
    assert "NATS_PASSWORD" not in seen
    assert seen.get("NATS_PASSWORD_FILE"), "its password came in a file"
    assert st.passwords["witness"] not in seen.values(), "the witness's own password never reaches an agent"
    for secret in (*st.callout_env().values(), st.passwords["auth"]):
        assert secret not in seen.values(), "nor the keys the witness mints and vouches with"
    assert not any(key.startswith("GT_AGENT_NATS_") for key in seen)
    assert seen.get("GT_LEASE_TOKEN"), "the agent held its hook lease, renewed in GT_LEASES with its own user"
    assert st.violations() == [], "every role had every permission its work needs"


SPY = """\
out="$GT_WORKTREE/../$GT_SESSION.spy"
mkdir -p "$out"
tmux -L "$GT_TMUX_SOCKET" show-environment -g > "$out/global-env" 2>&1
tmux -L "$GT_TMUX_SOCKET" list-panes -a -F '#{pane_start_command}' > "$out/start-commands" 2>&1
for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f" 2>/dev/null; echo; done > "$out/cmdlines"
env > "$out/env"
stat -c %a "$NATS_PASSWORD_FILE" > "$out/mode" 2>&1
"""
"""What an agent (any process of the OS user the agents run as) can find out before it starts working: the tmux
server's global environment, the command lines tmux started panes with, every process's command line."""


async def test_an_agents_password_reaches_it_in_a_private_file_never_on_a_command_line_or_in_tmux(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The witness holds its own password and the session keys (as under docker-compose); it starts the tmux server.
    for key, value in st.witness_env().items():
        monkeypatch.setenv(key, value)
    spy = tmp_path / "spy.sh"
    spy.write_text(SPY)
    async with services_as_themselves(st, tmp_path, "mayor", "witness", "refinery") as town:
        added = await st.gt("operator", "rig", "add", "demo", str(town.origin), "--agent", f"sh {spy}; gt-agent")
        assert added.returncode == 0, added.stderr
        created = await st.gt("operator", "bead", "create", "Keep secrets")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        assert (await st.gt("operator", "sling", bead, "demo")).returncode == 0
        sessions = await town.wait_settled(bead, timeout=120)
        # It finished as its own session identity: its `gt` read the password from the file (the server requires it).
        assert [s.end_reason for s in sessions] == ["done"]
        spied = Path(sessions[0].worktree).parent / f"{sessions[0].id}.spy"
        seen = {name: (spied / name).read_text() for name in ("global-env", "start-commands", "cmdlines", "env")}
        assert "NATS_PASSWORD" not in seen["global-env"], seen["global-env"]
        for name, secret in (("witness", st.passwords["witness"]), *st.callout_env().items()):
            for what, text in seen.items():
                assert secret not in text, f"the {name}'s secret is in what an agent sees: {what}"
        env = dict(line.split("=", 1) for line in seen["env"].splitlines() if "=" in line)
        password_file = Path(env["NATS_PASSWORD_FILE"])
        assert (spied / "mode").read_text().strip() == "600"
        await assert_eventually(
            lambda: not password_file.exists(), timeout=60, message="the file goes when the session is cleaned"
        )
    assert st.violations() == []


def agent_environment(worktree: str, session: str) -> dict[str, str]:
    dumped = Path(worktree).parent / f"{session}.env"
    return dict(line.split("=", 1) for line in dumped.read_text().splitlines() if "=" in line)


# ---- and nothing more ---------------------------------------------------------------------------


async def test_a_plugin_can_neither_append_events_nor_send_commands(st: SecuredTown, tmp_path: Path) -> None:
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        created = await st.gt("operator", "bead", "create", "Already here")
        assert created.returncode == 0, created.stderr
        before = await snapshot(town.nc, "mayor")

        nc = await st.connect("plugin")
        js = nc.jetstream()
        try:
            with structlog.testing.capture_logs() as logs:
                evt = await refused(nc, js.publish("gt.evt.x", b"{}", stream="GT_EVT", timeout=5), "gt.evt.x")
                cmd_body = b'{"title": "from a plugin"}'
                await refused(nc, js.publish("gt.cmd.bead.create", cmd_body, timeout=5), "gt.cmd.bead.create")
                await refused(nc, nc.publish("gt.evt.bead.forged", b"{}"), "gt.evt.bead.forged")  # core, no ack
        finally:
            await close_quietly(nc)
        assert (evt.user, evt.operation) == ("plugin", "publish")
        assert "NATS user plugin may not publish to gt.evt.x" in str(evt)
        logged = [(e["subject"], e["user"]) for e in logs if e["event"] == "nats_permission_denied"]
        assert logged == [("gt.evt.x", "plugin"), ("gt.cmd.bead.create", "plugin"), ("gt.evt.bead.forged", "plugin")]

        by_cli = await st.gt("plugin", "bead", "create", "from a plugin, through gt")
        denied_by_cli(by_cli, "plugin", "gt.cmd.bead.create")
        assert await snapshot(town.nc, "mayor") == before, "nothing was stored, nothing changed"

    lines = st.violations()
    for subject in ("gt.evt.x", "gt.cmd.bead.create", "gt.evt.bead.forged"):
        assert any('"PLUGINS/user:plugin"' in line and f'Subject "{subject}"' in line for line in lines), lines


async def test_an_agent_can_neither_add_rigs_nor_close_beads(st: SecuredTown, tmp_path: Path) -> None:
    async with services_as_themselves(st, tmp_path, "mayor", "witness") as town:
        created = await st.gt("operator", "bead", "create", "The operator's bead")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        before = await snapshot(town.nc, "mayor", "witness")

        session = SessionOrigin("demo", "ace", "hq-some-1")
        async with responder_for(st, lambda s: s == session.session):
            rig_add = await st.gt_in_session(session, "hq-some", "rig", "add", "evil", str(town.origin))
            # Inside a session the CLI sends on the session's own subjects: of those, only the agent's commands.
            denied_by_cli(rig_add, session.session, subjects.session_command_subject("rig", "add", session))
            close = await st.gt_in_session(session, "hq-some", "bead", "close", bead, "--reason", "not mine to close")
            denied_by_cli(close, session.session, subjects.session_command_subject("bead", "close", session))
            sling = await st.gt_in_session(session, "hq-some", "sling", bead, "evil")
            denied_by_cli(sling, session.session, subjects.session_command_subject("bead", "sling", session))

            assert await snapshot(town.nc, "mayor", "witness") == before, "nothing was stored, nothing changed"
            shown = await st.gt("operator", "bead", "show", bead, "--json")
            assert json.loads(shown.stdout)["status"] == "open"
            rigs = await st.gt("operator", "rig", "list", "--json")
            assert json.loads(rigs.stdout) == []

            # The same session may send what agents send: the refusals above are about the subjects.
            mail = await st.gt_in_session(
                session, "hq-some", "mail", "send", "operator", "--body", "I may not close it"
            )
            assert mail.returncode == 0, mail.stderr
        assert (await snapshot(town.nc, "mayor")).evt_last_seq > before.evt_last_seq

    lines = st.violations()
    for subject in ("gt.cmd.rig.add", "gt.cmd.bead.close", "gt.cmd.bead.sling"):
        on_its_own = f'Subject "{subject}.demo.ace.hq-some-1"'
        assert any('"AGENTS/user:hq-some-1"' in line and on_its_own in line for line in lines), lines


async def test_the_operator_can_neither_forge_events_nor_delete_or_purge(st: SecuredTown, tmp_path: Path) -> None:
    # No refinery: a merge request command waits in GT_CMD, so there is something a purge would lose.
    async with services_as_themselves(st, tmp_path, "mayor", "witness") as town:
        created = await st.gt("operator", "bead", "create", "A bead with a history")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        waiting = await st.gt("operator", "mq", "retry", "mr-0123456789")
        assert waiting.returncode == 0, waiting.stderr
        assert "refinery is not running" in waiting.stderr, waiting.stderr  # stored: said on stderr
        before = await snapshot(town.nc, "mayor", "witness")
        assert before.cmd_messages >= 1

        nc = await st.connect("operator")
        js = nc.jetstream()
        forged = {"id": "forged-1", "type": "bead.closed", "ts": "2026-01-01T00:00:00Z", "actor": "mayor"}
        forged_data = json.dumps({**forged, "data": {"bead_id": bead, "reason": "forged"}}).encode()
        subject = f"gt.evt.bead.{bead}"
        try:
            denied = await refused(nc, js.publish(subject, forged_data, stream="GT_EVT", timeout=5), subject)
            await refused(nc, nc.request(subject, forged_data, timeout=5), subject)  # as the services append
            # A CI gate's opening is the deacon's word: an operator approves a gate (gate.approve) instead.
            gate_open = json.dumps({"bead": bead, "step": "s", "cmd_id": "operator-gate-open"}).encode()
            await refused(nc, js.publish("gt.cmd.gate.open", gate_open, stream="GT_CMD", timeout=5), "gt.cmd.gate.open")
            await refused(nc, js.delete_stream("GT_EVT"), "$JS.API.STREAM.DELETE.GT_EVT")
            await refused(nc, js.delete_stream("GT_CMD"), "$JS.API.STREAM.DELETE.GT_CMD")
            await refused(nc, js.purge_stream("GT_CMD"), "$JS.API.STREAM.PURGE.GT_CMD")
            await refused(nc, js.delete_msg("GT_CMD", before.cmd_last_seq), "$JS.API.STREAM.MSG.DELETE.GT_CMD")
            await refused(
                nc, js.delete_consumer("GT_CMD", "refinery-cmd"), "$JS.API.CONSUMER.DELETE.GT_CMD.refinery-cmd"
            )
        finally:
            await close_quietly(nc)
        assert (denied.user, denied.operation) == ("operator", "publish")

        assert await snapshot(town.nc, "mayor", "witness") == before, "nothing was stored, deleted or purged"
        history = await st.gt("operator", "bead", "history", bead, "--json")
        assert history.returncode == 0, history.stderr
        assert [e["type"] for e in json.loads(history.stdout)] == ["bead.created"]
        # Looking is all the operator needs for the town's picture: status, the feed.
        status = await st.gt("operator", "status", "--json")
        assert status.returncode in (0, 1), status.stderr  # 1: not every service of this town runs
        assert json.loads(status.stdout)["services"]["mayor"]["state"] == "healthy"
        feed = await st.gt("operator", "feed", "--since", "all", "--no-follow", "--type", "bead.created")
        assert feed.returncode == 0, feed.stderr
        assert bead in feed.stdout

    lines = st.violations()
    for refused_subject in (subject, "$JS.API.STREAM.DELETE.GT_EVT", "$JS.API.STREAM.PURGE.GT_CMD"):
        assert any('"GT/user:operator"' in line and f'Subject "{refused_subject}"' in line for line in lines), lines


async def test_a_wrong_password_is_refused_and_said_so(st: SecuredTown) -> None:
    env_user = "operator"
    st.passwords[env_user] = "not-the-password"
    listed = await st.gt(env_user, "bead", "list")
    assert listed.returncode == 3, listed.stderr
    assert "the server refused the credentials of user operator" in listed.stderr


# ---- merge requests: only a session's own work, never by the agent user's hand (issue 20) --------------


async def test_the_agent_user_can_neither_merge_an_operators_bead_nor_delete_a_branch(
    st: SecuredTown, tmp_path: Path
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor", "witness", "refinery") as town:
        added = await st.gt("operator", "rig", "add", "demo", str(town.origin))
        assert added.returncode == 0, added.stderr
        release = town.push_branch("release", {"RELEASE.txt": "the release line\n"})
        main_before = ref(town.origin, "main")
        created = await st.gt("operator", "bead", "create", "The operator's bead, never slung")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()

        forger = subjects.SessionOrigin("demo", "ace", "hq-forged-1")
        async with responder_for(st, lambda s: s == forger.session):
            config = st.session_config(forger, bead)
            agent = await connect(config, name="test-forger")
            await _forge_merge_requests(agent, config, bead, release)

        assert await submitted_mrs(town.nc) == [], "nothing entered the merge queue"
        assert ref(town.origin, "release") == release, "the branch release is still there"
        assert ref(town.origin, "main") == main_before, "nothing was merged"
        shown = await st.gt("operator", "bead", "show", bead, "--json")
        assert json.loads(shown.stdout)["status"] == "open"


async def _forge_merge_requests(agent: Client, config: TownConfig, bead: str, release: str) -> None:
    """A session (its own identity) trying to merge the operator's bead and another branch: every way refused."""
    try:
        # The attack of the issue: a merge request for the operator's bead, of the branch `release`.
        attack = json.dumps({"bead": bead, "rig": "demo", "branch": "release", "head": release}).encode()
        await refused(agent, agent.jetstream().publish("gt.cmd.mr.submit", attack, timeout=5), "gt.cmd.mr.submit")
        # The agents' own subject takes a session's merge request only: no session, no lease, a forged one.
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"branch": "release"}, "invalid", "`session` is required"),
            ({"branch": "release", "session": "hq-forged-1"}, "unauthorized", "hook lease as its `fence`"),
            (
                {"branch": f"polecat/ace/{bead}", "session": "hq-forged-1",
                 "fence": {"lease": hook_lease_name(bead), "token": 1}},
                "conflict", "was never acquired",
            ),
            (
                {"branch": "release", "session": "hq-forged-1", "actor": "operator",
                 "fence": {"lease": "hook-other", "token": 1}},
                "unauthorized", "only the bead it holds",
            ),
        ]  # fmt: skip
        for extra, code, said in cases:
            body = {"bead": bead, "rig": "demo", "head": release, "cmd_id": f"t-{secrets.token_hex(6)}", **extra}
            origin = subjects.SessionOrigin("demo", "ace", str(extra.get("session", "hq-forged-1")))
            forged = msgspec.convert(body, MergeRequestDone)  # on the session's own subject: the origin's
            outcome = await bus_commands.send(agent, config, forged, origin=origin, timeout=60, wait_if_down=True)
            assert outcome.type == "cmd.rejected", (extra, outcome)
            assert outcome.rejected is not None
            assert outcome.rejected.code == code, (extra, outcome.data)
            assert said in outcome.rejected.message, (extra, outcome.data)
    finally:
        await close_quietly(agent)


def ref(origin: Path, branch: str) -> str:
    return git.git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=origin, check=False).strip()


async def submitted_mrs(nc: Client) -> list[dict[str, Any]]:
    return [data for kind, data in await events_of(nc, "gt.evt.mr.>") if kind == "mr.submitted"]
