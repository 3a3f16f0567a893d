"""The mayor agent's pure parts (issue 43, docs/mayor-agent.md): its credential and permissions, how the intake
and the query server take its subject and its login, the witness's decisions, fold and plan, the answer read from
a transcript."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from services.mayor import decide as mayor_decide
from services.mayor.projection import new_projection as new_mayor_projection
from services.witness import decide as witness_decide
from services.witness.effects.agent_user import resolve_town_agents
from services.witness.effects.auth import kick_due, session_live
from services.witness.effects.nudge import escalation_announcement
from services.witness.plan import town_agents as plan
from services.witness.plan.actions import DeliverAsk, EndTownAgent, LaunchTownAgent, RecordAnswer, TellTownAgent
from services.witness.plan.observed import TownAgentSeen
from services.witness.plan.scope import route
from services.witness.projection import new_projection
from services.witness.state import WitnessState
from shared.core import subjects
from shared.core.errors import CommandError
from shared.host.os_user import OsUser
from shared.model import commands as cmds
from shared.model import transcripts
from shared.model.events import (
    BeadCreated,
    BeadUpdated,
    EscalationRaised,
    TownAgentAnswered,
    TownAgentAskDelivered,
    TownAgentLaunched,
    TownAgentTold,
)
from shared.model.session_identity import (
    TOWN_AGENT_COMMANDS,
    Refusal,
    SessionBuckets,
    TownAgentClaim,
    mint,
    mint_town_agent,
    town_agent_permissions,
    verify,
)
from shared.service.intake.identity import Sender, command_actor
from tests.memory_log import T0, Deciding
from tests.unit.test_session_identity import claims_of, responder, server_request
from tests.unit.test_witness_decide import with_session

KEY = b"k" * 32
NOW = 1_800_000_000
BUCKETS = SessionBuckets("GT_EVT", "GT_HEARTBEATS", "GT_LEASES")
MAYOR = subjects.TownAgentOrigin("mayor")


# ---- its credential and permissions ----------------------------------------------------------------


def test_a_town_agent_credential_says_which_agent_until_it_expires_and_nothing_else_passes_for_it() -> None:
    password = mint_town_agent(KEY, name="mayor", run=3, expires_at=NOW + 60)
    assert password.startswith("a1.mayor.3.")
    claim = TownAgentClaim(name="mayor", run=3, expires_at=NOW + 60)
    assert verify(KEY, "agent-mayor", password, NOW) == claim
    assert claim.login == "agent-mayor#3"
    assert verify(KEY, "agent-mayor", password.replace(".3.", ".4.", 1), NOW) == Refusal(
        "the password of town agent mayor is not one the witness minted"
    )  # another run's: its MAC covers the run
    refused = [
        verify(KEY, "hq-abc123-1", password, NOW),  # another user
        verify(KEY, "agent-mayor", password, NOW + 60),  # expired
        verify(b"other" * 8, "agent-mayor", password, NOW),  # another town's key
        verify(KEY, "agent-mayor", password[:-2] + "00", NOW),  # tampered
        verify(KEY, "agent-deputy", password.replace(".mayor.", ".deputy."), NOW),  # no such agent
        # A session's credential never logs in as the mayor agent, whatever user it names.
        verify(
            KEY,
            "agent-mayor",
            mint(KEY, session="hq-abc123-1", rig="d", polecat="a", bead="hq-abc123", expires_at=NOW + 60),
            NOW,
        ),
    ]
    assert all(isinstance(r, Refusal) for r in refused), refused
    with pytest.raises(ValueError, match="no town agent"):
        mint_town_agent(KEY, name="deputy", run=1, expires_at=NOW + 60)


def test_the_mayor_agent_may_publish_its_own_command_subjects_queries_and_outcomes_and_nothing_else() -> None:
    permissions = town_agent_permissions(TownAgentClaim(name="mayor", run=1, expires_at=NOW), BUCKETS)
    allowed = permissions["pub"]["allow"]
    own = [f"gt.cmd.{agg}.{verb}.agent.mayor" for agg, verb in TOWN_AGENT_COMMANDS]
    assert allowed == [*own, "gt.q.>", "$JS.API.DIRECT.GET.GT_EVT.gt.evt.cmd.agent-mayor.*"]
    assert permissions["sub"] == {"allow": ["_INBOX_s-agent-mayor.>"]}
    verbs = set(TOWN_AGENT_COMMANDS)
    for kept in (("gate", "approve"), ("gate", "open"), ("rig", "add"), ("mr", "reject"), ("session", "stop")):
        assert kept not in verbs, kept
    assert not [s for s in allowed if s.startswith(("$KV", "$JS.API.STREAM", "$JS.API.CONSUMER", "gt.evt"))]


def test_the_callout_grants_a_running_town_agent_its_own_identity_and_refuses_a_stopped_one() -> None:
    password = mint_town_agent(KEY, name="mayor", run=2, expires_at=NOW + 60)
    granted = claims_of(responder({"agent-mayor#2"}).answer(server_request("agent-mayor", password)) or b"")
    user = claims_of(granted["nats"]["jwt"])
    assert (user["aud"], user["name"], user["exp"]) == ("AGENTS", "agent-mayor", NOW + 60)
    assert "gt.cmd.bead.create.agent.mayor" in user["nats"]["pub"]["allow"]
    stopped = claims_of(responder({"agent-mayor#3"}).answer(server_request("agent-mayor", password)) or b"")
    assert stopped["nats"]["error"] == "town agent mayor is not running, or runs another launch than run 2"


# ---- its subject and its login, as the services take them -----------------------------------------------


def test_its_commands_are_recorded_as_itself_charged_as_an_operator_and_only_its_own_verbs_pass() -> None:
    own, origin = subjects.split_origin("gt.cmd.bead.create.agent.mayor")
    assert (own, origin) == ("gt.cmd.bead.create", MAYOR)
    assert subjects.id_scope(origin) == "agent-mayor"
    assert command_actor("operator:ann", MAYOR, command=own) == Sender("agent:mayor", "operator")
    refused = command_actor(None, MAYOR, command="gt.cmd.gate.approve")
    assert isinstance(refused, CommandError)
    assert refused.code == "unauthorized"
    nobody = command_actor(None, subjects.TownAgentOrigin("deputy"), command=own)
    assert isinstance(nobody, CommandError)
    # A plain subject's body may not name it either.
    named = command_actor("agent:mayor", None)
    assert isinstance(named, CommandError)
    assert named.code == "unauthorized"


def test_its_queries_are_answered_as_an_operators_and_a_session_named_like_it_is_still_a_session() -> None:
    info: dict[str, object] = {"acc": subjects.SESSION_ACCOUNT, "user": "agent-mayor"}
    assert subjects.session_of_request("_R_.x", info) is None
    assert subjects.session_of_request("_R_.x", {**info, "user": "agent-mayor-1"}) == "agent-mayor-1"


# ---- the witness: decisions, fold, plan -------------------------------------------------------------


def witness() -> Deciding:
    return Deciding(new_projection(), witness_decide.decide, clock=T0)


def state_of(fed: Deciding) -> WitnessState:
    return fed.projection.state  # type: ignore[no-any-return]


def test_start_stop_and_ask_are_decided_once_and_an_ask_needs_a_running_agent() -> None:
    fed = witness()
    assert fed.reject("gt.cmd.agent.ask", text="hello").code == "conflict"
    assert fed.reject("gt.cmd.agent.start", agent="gt-agent").code == "invalid"  # keeps no transcript
    started = fed.send("gt.cmd.agent.start")
    assert (started["id"], started["status"], started["agent"], started["changed"]) == (
        "mayor",
        "running",
        "claude",
        True,
    )
    assert fed.send("gt.cmd.agent.start", agent="codex")["changed"] is False  # running: its runtime stays
    asked = fed.send("gt.cmd.agent.ask", text="what is ready?")
    agent = state_of(fed).town_agents["mayor"]
    assert [(a.id, a.text) for a in agent.asks] == [(asked["ask_id"], "what is ready?")]
    assert fed.send("gt.cmd.agent.stop")["status"] == "stopped"
    assert fed.send("gt.cmd.agent.stop")["changed"] is False
    assert (state_of(fed).town_agents["mayor"].wanted, state_of(fed).town_agents["mayor"].asks) == (False, [])
    assert fed.reject("gt.cmd.agent.ask", text="one\ntwo").code == "invalid"
    assert fed.reject("gt.cmd.agent.start", name="deputy").code == "invalid"


def launched(fed: Deciding, run: int, pid: int = 100) -> None:
    fed.add(TownAgentLaunched(name="mayor", run=run, tmux_name="gt_agent_mayor", pane_pid=pid))


def test_the_plan_launches_a_dead_agent_types_one_request_at_a_time_and_records_its_answer() -> None:
    fed = witness()
    fed.send("gt.cmd.agent.start")
    now = T0 + timedelta(seconds=1)
    assert list(plan.owed(state_of(fed), {}, now)) == [LaunchTownAgent(name="mayor", run=1)]
    launched(fed, 1)
    first = fed.send("gt.cmd.agent.ask", text="first")["ask_id"]
    second = fed.send("gt.cmd.agent.ask", text="second")["ask_id"]
    busy = {"mayor": TownAgentSeen(pane=True, alive=True, idle=False)}
    idle = {"mayor": TownAgentSeen(pane=True, alive=True, idle=True)}
    assert list(plan.owed(state_of(fed), busy, now)) == []  # typed only at its prompt
    assert list(plan.owed(state_of(fed), idle, now)) == [DeliverAsk(name="mayor", ask=first, run=1)]
    fed.add(TownAgentAskDelivered(name="mayor", ask_id=first, run=1))
    assert list(plan.owed(state_of(fed), idle, now)) == []  # the second waits for the first's answer
    # Typed, and its runtime did not take it in (the key that sends it was lost): sent again, not before 20 s.
    lost = {"mayor": TownAgentSeen(pane=True, alive=True, idle=True, received=False)}
    assert list(plan.owed(state_of(fed), lost, now)) == []
    later = T0 + plan.RESUBMIT_AFTER
    assert list(plan.owed(state_of(fed), lost, later)) == [DeliverAsk(name="mayor", ask=first, run=1, again=True)]
    answered = {"mayor": TownAgentSeen(pane=True, alive=True, idle=True, answer="done")}
    assert list(plan.owed(state_of(fed), answered, now)) == [RecordAnswer(name="mayor", ask=first, text="done")]
    fed.add(TownAgentAnswered(name="mayor", ask_id=first, text="done"))
    assert list(plan.owed(state_of(fed), idle, now)) == [DeliverAsk(name="mayor", ask=second, run=1)]
    fed.add(TownAgentAskDelivered(name="mayor", ask_id=second, run=1))
    # It dies mid-turn: launched again, and the request it worked on is typed into the new run.
    assert list(plan.owed(state_of(fed), {"mayor": TownAgentSeen(pane=True)}, now)) == [
        LaunchTownAgent(name="mayor", run=2)
    ]
    launched(fed, 2, pid=200)
    assert list(plan.owed(state_of(fed), idle, now)) == [DeliverAsk(name="mayor", ask=second, run=2)]
    fed.send("gt.cmd.agent.stop")
    assert list(plan.owed(state_of(fed), idle, now)) == [EndTownAgent(name="mayor")]
    assert list(plan.owed(state_of(fed), {}, now)) == []


def test_an_agent_that_keeps_dying_is_launched_again_only_once_its_oldest_recent_launch_is_old() -> None:
    fed = witness()
    fed.send("gt.cmd.agent.start")
    for run in range(1, 6):
        launched(fed, run, pid=run)
    agent = state_of(fed).town_agents["mayor"]
    first = agent.launches[0]
    assert not plan.launch_due(agent, first + plan.RESTART_WINDOW - timedelta(seconds=1))
    assert list(plan.owed(state_of(fed), {}, first + timedelta(seconds=30))) == []
    assert list(plan.owed(state_of(fed), {}, first + plan.RESTART_WINDOW)) == [LaunchTownAgent(name="mayor", run=6)]


def test_its_login_lives_for_its_newest_launch_while_started_and_only_a_witness_of_every_rig_settles_it() -> None:
    fed = witness()
    assert not session_live(state_of(fed), "agent-mayor#1")
    fed.send("gt.cmd.agent.start")
    assert session_live(state_of(fed), "agent-mayor#1")  # minted for its first launch, before it is recorded
    launched(fed, 1)
    launched(fed, 2, pid=200)
    assert not session_live(state_of(fed), "agent-mayor#1")  # a killed launch's credential (a copy) is dead
    assert kick_due(state_of(fed), "agent-mayor#1", T0)
    assert session_live(state_of(fed), "agent-mayor#2")
    assert not kick_due(state_of(fed), "agent-mayor#2", T0)
    assert not session_live(state_of(fed), "agent-mayor")  # no launch named: no login
    fed.send("gt.cmd.agent.stop")
    assert kick_due(state_of(fed), "agent-mayor#2", T0)
    ask = cmds.TownAgentAsk(text="hi")
    assert route(state_of(fed), ask, None) == "mine"
    assert route(state_of(fed), ask, frozenset({"demo"})) == "elsewhere"


# ---- the answer, from the transcript ------------------------------------------------------------------


def lines(*records: dict[str, object]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def claude(role: str, content: object, stop: str | None = None) -> dict[str, object]:
    return {"type": role, "message": {"role": role, "content": content, "stop_reason": stop}}


def test_the_answer_is_the_last_words_of_the_turn_the_request_began_once_it_ended() -> None:
    asked = "add a mean function to rig calc"
    begun = lines(
        claude("user", "[gastown] You are the town's mayor agent"),
        claude("assistant", [{"type": "text", "text": "Ready."}], "end_turn"),
        claude("user", asked),
        claude("assistant", [{"type": "tool_use", "name": "Bash", "input": {"command": "gt ready"}}], "tool_use"),
        claude("user", [{"type": "tool_result", "content": "(no beads)"}]),
    )
    assert transcripts.answer_to(begun, asked, transcripts.claude_mark) is None  # its turn runs
    ended = [*begun, *lines(claude("assistant", [{"type": "text", "text": "Filed hq-aaaaaa."}], "end_turn"))]
    assert transcripts.answer_to(ended, asked, transcripts.claude_mark) == "Filed hq-aaaaaa."
    assert transcripts.answer_to(ended, "something never asked", transcripts.claude_mark) is None
    # Typed again (a restarted agent's new conversation, in the same file or a newer one): its newest turn counts.
    again = [*ended, *lines(claude("user", asked))]
    assert transcripts.answer_to(again, asked, transcripts.claude_mark) is None
    rollout = lines(
        {
            "type": "response_item",
            "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": asked}]},
        },
        {"type": "event_msg", "payload": {"type": "task_complete", "last_agent_message": "Filed it."}},
    )
    assert transcripts.answer_to(rollout, asked, transcripts.codex_mark) == "Filed it."


def test_the_mayor_agent_needs_an_os_user_of_its_own_where_polecats_have_one() -> None:
    polecats = OsUser(name="nobody", uid=65534, gid=65534, switch=True)
    with pytest.raises(ValueError, match="GT_AGENT_USER's user"):
        resolve_town_agents("nobody", polecats, euid=0)
    assert resolve_town_agents("", polecats, euid=0) is None
    fed = witness()
    problem = "the polecats run as GT_AGENT_USER=agent, and the mayor agent has no OS user of its own"
    refused = fed.reject("gt.cmd.agent.start", facts=witness_decide.TownAgentFacts(problem))
    assert (refused.code, refused.message) == ("invalid", problem)
    assert fed.send("gt.cmd.agent.start", facts=witness_decide.TownAgentFacts(None))["changed"] is True


def test_the_mayor_agent_speaks_as_itself_to_polecats_and_in_escalations_and_reads_only_its_own_mail() -> None:
    nudged = with_session(witness())
    queued = nudged.send("gt.cmd.nudge.send", sender="agent:mayor", target="demo-1-1", message="push now")
    assert queued["status"] == "queued"
    [nudge] = nudged.projection.state.nudges.values()
    assert nudge.message == "[gastown nudge from agent:mayor, an agent, not your operator] push now"
    town = Deciding(new_mayor_projection(), mayor_decide.decide, clock=T0)
    refused = town.reject("gt.cmd.bead.create", sender="agent:mayor", title="from operator", type="message")
    assert refused.code == "unauthorized"
    assert town.send("gt.cmd.bead.create", sender="agent:mayor", title="Add mean()")["changed"] is True
    raised = town.send("gt.cmd.escalation.raise", sender="agent:mayor", severity="high", message="m", source="witness")
    assert town.projection.state.escalations[raised["id"]].source == "agent:mayor"
    to_mayor = town.send("gt.cmd.mail.send", to="mayor", subject="hi", body="b")["id"]
    to_operator = town.send("gt.cmd.mail.send", sender="polecat:demo/ace", to="operator", subject="x", body="b")["id"]
    assert town.send("gt.cmd.mail.read", sender="agent:mayor", id=to_mayor)["read"] is True
    assert town.reject("gt.cmd.mail.read", sender="agent:mayor", id=to_operator).code == "unauthorized"


def test_mail_to_it_and_escalations_are_told_between_requests_once_each_and_quoted() -> None:
    fed = witness()
    fed.send("gt.cmd.agent.start")
    launched(fed, 1)
    fed.add(
        BeadCreated(
            bead_id="hq-mail01",
            title="Use v2 $(id)",
            type="message",
            assignee="mayor",
            metadata={"from": "polecat:demo/ace"},
        ),
        EscalationRaised(escalation_id="esc-1", severity="high", source="witness", message="rig demo died"),
        EscalationRaised(escalation_id="esc-2", severity="low", source="agent:mayor", message="its own"),
    )
    agent = state_of(fed).town_agents["mayor"]
    assert [(n.id, n.kind) for n in agent.notices] == [("hq-mail01", "mail"), ("esc-1", "escalation")]
    idle = {"mayor": TownAgentSeen(pane=True, alive=True, idle=True)}
    now = T0 + timedelta(seconds=1)
    ask = fed.send("gt.cmd.agent.ask", text="what is ready?")["ask_id"]
    assert list(plan.owed(state_of(fed), idle, now)) == [DeliverAsk(name="mayor", ask=ask, run=1)]  # requests first
    fed.add(TownAgentAnswered(name="mayor", ask_id=ask, text="nothing"))
    assert list(plan.owed(state_of(fed), idle, now)) == [TellTownAgent(name="mayor", notice="hq-mail01", run=1)]
    busy = {"mayor": TownAgentSeen(pane=True, alive=True, idle=False)}
    assert list(plan.owed(state_of(fed), busy, now)) == []
    fed.add(TownAgentTold(name="mayor", notice="hq-mail01"))
    fed.add(BeadUpdated(bead_id="esc-1", add_labels=["read"]))  # not a message: changes nothing
    assert list(plan.owed(state_of(fed), idle, now)) == [TellTownAgent(name="mayor", notice="esc-1", run=1)]
    typed = escalation_announcement("esc-1", "high", "witness", "rig demo died'; rm -rf ~ #\n\x1b[2J")
    assert typed == (
        "[gastown escalation esc-1 (high) from witness, not your operator] "
        "'rig demo died\u2019; rm -rf ~ #\\n\\x1b[2J' (see it with: gt escalations)"
    )


def test_a_prompt_taken_in_and_a_turn_ended_are_told_apart_in_a_transcript() -> None:
    asked = "what is ready?"
    started = lines(claude("user", "[gastown] beacon"))
    assert transcripts.heard(started, asked, transcripts.claude_mark) == (False, False)
    first_turn = [*started, *lines(claude("assistant", [{"type": "text", "text": "Ready."}], "end_turn"))]
    assert transcripts.heard(first_turn, asked, transcripts.claude_mark) == (False, True)
    taken = [*first_turn, *lines(claude("user", asked))]
    assert transcripts.heard(taken, asked, transcripts.claude_mark) == (True, True)
