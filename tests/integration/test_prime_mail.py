"""What a fresh session is told about its predecessors (`gt prime`'s "Before you"), and agent mail: addresses
checked at the mayor, a polecat's unread mail in its prime and nudged into its pane, `gt mail` from a session.

Real nats-server, mayor, witness and refinery, agents in real tmux, real git; the gt CLI as an agent runs it."""

from __future__ import annotations

import json

from tests.helpers import assert_eventually
from tests.witness_town import PolecatTown, run_gt


async def session_started(pt: PolecatTown, bead: str, attempt: int) -> str:
    """The id of the bead's session of ``attempt``, once it is started."""

    def started() -> str:
        sessions = pt.sessions_of(bead)
        assert len(sessions) >= attempt, f"no session {attempt} yet"
        assert sessions[attempt - 1].status == "started", sessions[attempt - 1].status
        return sessions[attempt - 1].id

    found: str = await assert_eventually(started, timeout=60, interval=0.05)
    return found


def session_env(pt: PolecatTown, gt_env: dict[str, str], bead: str, attempt: int) -> dict[str, str]:
    """The environment the witness gives the session's agent (the parts `gt` reads)."""
    session = pt.sessions_of(bead)[attempt - 1]
    return {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_SESSION": session.id,
        "GT_BEAD": bead,
        "GT_RIG": session.rig,
        "GT_POLECAT": session.polecat,
        "GT_WORKTREE": session.worktree,
        "GT_BRANCH": session.branch,
    }


async def prime_of(env: dict[str, str], session: str) -> str:
    primed = await run_gt(env, "prime", "--session", session)
    assert primed.returncode == 0, primed.stderr
    return primed.stdout


# ---- point 3: what a fresh session learns about the sessions before it -------------------------


async def test_the_successor_of_a_handoff_is_primed_with_its_note(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang gt-agent")
    bead = await pt.new_bead("Hand it over with a note")
    await pt.sling(bead)
    await session_started(pt, bead, 1)
    note = "context full: step 2 is half done, the parser change is in parse.py, tests not run yet"
    handed = await run_gt(session_env(pt, gt_env, bead, 1), "handoff", "--note", note)
    assert handed.returncode == 0, handed.stderr
    second = await session_started(pt, bead, 2)
    first = pt.sessions_of(bead)[0].id
    text = await prime_of(gt_env | {"NATS_URL": pt.config.nats_url}, second)
    assert "Before you" in text, text
    assert f"{first} (attempt 1): handed off" in text, text
    assert note in text, text


async def test_a_warranted_predecessor_is_shown_with_its_reason_and_last_pane_lines(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(
        agent_command="echo 'last words: I was editing parse.py'; GT_AGENT_FAULT=hang gt-agent", stall_after_s=4.0
    )
    bead = await pt.new_bead("Stall, then be remembered")
    await pt.sling(bead)
    second = await session_started(pt, bead, 2)
    first = pt.sessions_of(bead)[0]
    assert (first.warrant_reason, first.end_reason) == ("stalled", "stalled")
    text = await prime_of(gt_env | {"NATS_URL": pt.config.nats_url}, second)
    assert f"{first.id} (attempt 1): warranted (stalled)" in text, text
    assert "no heartbeat, step progress or agent activity" in text, text
    assert "last words: I was editing parse.py" in text, "the pane's last lines, from the warrant in the log"
    assert "hanging (fault injection)" in text, text


# ---- point 7: agent mail -----------------------------------------------------------------------


async def test_mail_to_an_unknown_or_malformed_address_is_rejected(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang gt-agent")
    bead = await pt.new_bead("Be there to be written to")
    await pt.sling(bead)
    await session_started(pt, bead, 1)
    env = gt_env | {"NATS_URL": pt.config.nats_url}
    for address, code, words in (
        ("demo/nobody", "not_found", "rig demo has no polecat 'nobody'"),
        ("polecat:nope/ace", "not_found", "no rig 'nope'"),
        ("nope", "not_found", "no rig 'nope'"),
        ("rig:nope", "not_found", "no rig 'nope'"),
        ("someone:x", "invalid", "polecat:<rig>/<name>"),
        ("polecat:demo", "invalid", "polecat:<rig>/<name>"),
    ):
        sent = await run_gt(env, "mail", "send", address, "--body", "hello?")
        assert sent.returncode != 0, (address, sent.stdout)
        assert f"rejected ({code})" in sent.stderr, (address, sent.stderr)
        assert words in sent.stderr, (address, sent.stderr)
    accepted = await run_gt(env, "mail", "send", "demo/ace", "--body", "hello ace")
    assert accepted.returncode == 0, accepted.stderr
    assert "sent to polecat:demo/ace" in accepted.stdout, "the short form is normalised"


async def test_mail_to_a_live_polecat_is_primed_nudged_and_answered_from_its_session(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang gt-agent")
    bead = await pt.new_bead("Read your mail")
    await pt.sling(bead)
    session = await session_started(pt, bead, 1)
    tmux_name = pt.sessions_of(bead)[0].tmux_name
    operator = gt_env | {"NATS_URL": pt.config.nats_url}
    sent = await run_gt(
        operator, "mail", "send", "polecat:demo/ace", "--subject", "Use the new API", "--body",
        "Please call v2 of the client, not v1.", "--actor", "operator:ann",
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    message = sent.stdout.split(":")[0]
    # The live session is told, once, in its pane.
    expected = (
        "[gastown mail from operator:ann, your operator] "
        f"subject: 'Use the new API' (read it with: gt mail read {message})"
    )
    await assert_eventually(lambda: expected in pt.tmux.capture(tmux_name).replace("\n", ""), timeout=60)
    # Its prime lists the unread message.
    text = await prime_of(operator, session)
    assert "Mail (1 unread)" in text, text
    assert f"{message} from operator:ann: Use the new API" in text, text
    # The operator reading the polecat's mail shows it, and leaves it unread for the polecat.
    peeked = await run_gt(operator, "mail", "read", message)
    assert peeked.returncode == 0, peeked.stderr
    assert "Please call v2 of the client, not v1." in peeked.stdout
    assert "left unread for polecat:demo/ace" in peeked.stderr, peeked.stderr
    assert "Mail (1 unread)" in await prime_of(operator, session)
    # An operator named by GT_ACTOR reads her own mail as herself: it is marked read.
    ann = operator | {"GT_ACTOR": "operator:ann"}
    to_ann = await run_gt(operator, "mail", "send", "operator:ann", "--body", "for ann")
    assert to_ann.returncode == 0, to_ann.stderr
    assert "for ann" in (await run_gt(ann, "mail", "read", to_ann.stdout.split(":")[0])).stdout
    assert "for ann" not in (await run_gt(ann, "mail", "inbox")).stdout
    # From the session: inbox, read, reply, all as polecat:demo/ace.
    me = session_env(pt, gt_env, bead, 1)
    inbox = await run_gt(me, "mail", "inbox")
    assert inbox.returncode == 0, inbox.stderr
    assert message in inbox.stdout, inbox.stdout
    assert "Use the new API" in inbox.stdout, inbox.stdout
    read = await run_gt(me, "mail", "read", message)
    assert read.returncode == 0, read.stderr
    assert "Please call v2 of the client, not v1." in read.stdout
    replied = await run_gt(me, "mail", "reply", message, "--body", "on it")
    assert replied.returncode == 0, replied.stderr
    assert "sent to operator:ann" in replied.stdout
    answers = await run_gt(operator, "mail", "inbox", "operator:ann", "--json")
    assert answers.returncode == 0, answers.stderr
    [answer] = [m for m in json.loads(answers.stdout) if m["metadata"].get("reply_to") == message]
    assert (answer["title"], answer["metadata"]["from"]) == ("Re: Use the new API", "polecat:demo/ace")
    # Read: it leaves the prime; a rig-wide message reaches the polecat as well.
    assert "Mail (" not in await prime_of(operator, session)
    to_rig = await run_gt(operator, "mail", "send", "demo", "--subject", "Freeze at 5pm", "--body", "no merges after")
    assert to_rig.returncode == 0, to_rig.stderr
    inbox = await run_gt(me, "mail", "inbox")
    assert "Freeze at 5pm" in inbox.stdout, inbox.stdout
    await assert_eventually(lambda: "Freeze at 5pm" in pt.tmux.capture(tmux_name).replace("\n", ""), timeout=60)
    assert pt.tmux.capture(tmux_name).replace("\n", "").count(expected) == 1, "nudged once per message"
