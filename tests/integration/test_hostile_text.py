"""Issue 38, point 7: text an agent writes never reaches an operator's terminal raw, and mail it sends another
agent is announced in that agent's pane as an agent's, not as the operator's words.

Real nats-server, mayor, witness and refinery; agents in real tmux. The hostile agent is a shell script the witness
runs in its polecat's pane, with the session's own environment: with the real `gt` it mails the operator and
another polecat, escalates and hands off, each text full of escape sequences (a new window title, a cleared
screen), carriage returns, bells, a C1 control and bidi overrides. The operator's real `gt` (a subprocess) then
prints them escaped; the other polecat's agent (``cat``) shows the announcement it was typed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import assert_eventually
from tests.integration.test_prime_mail import session_started
from tests.witness_town import PolecatTown

SUBJECT = "pwned\x1b]0;pwned\x07\x1b[2J\rRED\u202edlrow"
"""What the agent writes (its script makes it with printf): an OSC window title ended by BEL, a cleared screen, a
carriage return, a right-to-left override."""
SUBJECT_PRINTF = r"pwned\033]0;pwned\007\033[2J\rRED\342\200\256dlrow"
SUBJECT_SHOWN = "pwned\\x1b]0;pwned\\x07\\x1b[2J\\rRED\\u202edlrow"
BODY_PRINTF = r"body\033]0;pwned\007\nline two \033[31mred\r\bx\342\201\246iso\342\201\251 c1\302\233end"
BODY_LINE_SHOWN = "line two \\x1b[31mred\\r\\x08x\\u2066iso\\u2069 c1\\x9bend"
FORBIDDEN = {chr(c) for c in range(0x20) if chr(c) not in "\n\t"} | {"\x7f"} | {chr(c) for c in range(0x80, 0xA0)}
FORBIDDEN |= {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


async def gt(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """The real `gt` CLI, as the operator runs it; its exit status, stdout and stderr (bytes read as UTF-8)."""
    command = [sys.executable, "-m", "gt.cli.main", *args]
    done = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, check=False, timeout=120)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def assert_terminal_safe(what: str, text: str) -> None:
    """No byte below 0x20 but newline and tab, no DEL, no C1 control, no bidi override or isolate."""
    found = sorted({f"U+{ord(c):04X}" for c in text if c in FORBIDDEN})
    assert not found, f"`gt {what}` printed raw control characters {found}: {text!r}"


def hostile_script(root: Path, other: str) -> Path:
    """The agent: once (its successor after the handoff only waits), it mails the operator and polecat ``other``,
    escalates and hands off, with the session's own environment and the real `gt`."""
    done, log = root / "hostile.done", root / "hostile.log"
    script = root / "hostile.sh"
    script.write_text(
        f"""
if [ -e {done} ]; then exec sleep 600; fi
touch {done}
S=$(printf '{SUBJECT_PRINTF}')
B=$(printf '{BODY_PRINTF}')
exec >>{log} 2>&1
gt mail send operator --subject "$S" --body "$B"
gt mail send {other} --subject "$S" --body "$B"
gt escalate --severity high "$S
$B"
for try in 1 2 3 4 5 6 7 8 9 10; do gt handoff --note "note $S
$B" && break; sleep 1; done
exec sleep 600
"""
    )
    return script


async def test_agent_written_text_reaches_no_terminal_raw_and_its_mail_is_announced_as_an_agents(
    pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    # The other polecat first: its agent (cat) shows what the witness types into its pane.
    await pt.add_rig(name="other", agent_command="cat")
    listener = await pt.new_bead("Listen")
    await pt.sling(listener, rig="other")
    await session_started(pt, listener, 1)
    other = pt.sessions_of(listener)[0]
    # The hostile one.
    script = hostile_script(tmp_path, f"polecat:other/{other.polecat}")
    await pt.add_rig(agent_command=f"sh {script}")
    bead = await pt.new_bead("Be hostile")
    await pt.sling(bead)
    first = await session_started(pt, bead, 1)
    second = await session_started(pt, bead, 2)  # it handed off: its note is the first session's end
    hostile = pt.sessions_of(bead)[0]
    sender = f"polecat:demo/{hostile.polecat}"
    operator = gt_env | {"NATS_URL": pt.config.nats_url}

    async def operator_gt(*args: str) -> str:
        code, out, err = await gt(operator, *args)
        assert code == 0, (args, out, err)
        assert_terminal_safe(" ".join(args), out)
        assert_terminal_safe(" ".join(args), err)
        return out

    async def escalated() -> bool:
        _code, out, _err = await gt(operator, "escalations", "--json")
        assert any(str(e.get("message", "")).startswith("pwned") for e in json.loads(out)), out
        return True

    raised: bool = await assert_eventually(escalated, timeout=30, interval=0.5)
    assert raised

    # --json keeps the original text, as valid JSON, with every control character a JSON escape (`\u202e`, not the
    # override itself: a terminal showing the JSON is as safe as one showing the text view).
    _code, listed, _err = await gt(operator, "mail", "inbox", "--json")
    assert_terminal_safe("mail inbox --json", listed)
    messages = [m for m in json.loads(listed) if m["metadata"]["from"] == sender]
    assert [m["title"] for m in messages] == [SUBJECT], listed
    message = messages[0]["id"]

    inbox = await operator_gt("mail", "inbox")
    assert f"{sender}  " in inbox, inbox
    assert SUBJECT_SHOWN in inbox, inbox
    read = await operator_gt("mail", "read", message)
    assert f"{message}  {SUBJECT_SHOWN}" in read, read
    assert "  body\\x1b]0;pwned\\x07" in read.splitlines(), read
    assert f"  {BODY_LINE_SHOWN}" in read.splitlines(), "the body keeps its lines, each escaped"
    shown = await operator_gt("bead", "show", message)
    assert SUBJECT_SHOWN in shown, shown
    assert f"  {BODY_LINE_SHOWN}" in shown.splitlines(), shown
    thread = await operator_gt("mail", "thread", message)
    assert SUBJECT_SHOWN in thread, thread
    feed = await operator_gt("feed", "--since", "all", "--no-follow")
    assert f'created: "{SUBJECT_SHOWN}"' in feed, feed
    assert "\\x1b]0;pwned\\x07" in feed, feed
    escalations = await operator_gt("escalations")
    assert SUBJECT_SHOWN in escalations, escalations
    assert BODY_LINE_SHOWN in escalations, "the message's second line, under its column"
    session = await operator_gt("session", "show", first)
    assert f"end_detail: note {SUBJECT_SHOWN}\\nbody\\x1b]0;pwned\\x07\\n{BODY_LINE_SHOWN}" in session, session
    await operator_gt("session", "list", "--all")
    history = await operator_gt("bead", "history", bead)
    assert "\\x1b]0;pwned" in history, history
    primed = await operator_gt("prime", "--session", second)  # what the successor agent is told
    assert f"handed off; its note: note {SUBJECT_SHOWN}" in primed, primed

    async def json_of(*args: str) -> Any:
        code, out, err = await gt(operator, *args, "--json")
        assert code == 0, (args, out, err)
        assert_terminal_safe(" ".join((*args, "--json")), out)
        return json.loads(out)

    assert (await json_of("mail", "read", message))["title"] == SUBJECT
    assert (await json_of("bead", "show", message))["title"] == SUBJECT
    primed_json = await json_of("prime", "--session", second)
    assert primed_json["before_you"][0]["end_detail"].startswith(f"note {SUBJECT}"), primed_json
    _code, status, status_err = await gt(operator, "status")  # 1 when a service (the deacon) does not answer
    assert_terminal_safe("status", status + status_err)

    # The other polecat's pane: the mail announced as an agent's, on one line, escaped.
    announced = (
        f"[gastown mail from {sender}, written by an agent, not your operator] "
        f"subject: '{SUBJECT_SHOWN}' (read it with: gt mail read "
    ).replace(" ", "")

    def announcement() -> str:
        # The line wraps in the pane; tmux may drop a space at the end of a wrapped row: compared without spaces.
        screen = pt.tmux.capture(other.tmux_name)
        assert announced in screen.replace("\n", "").replace(" ", ""), screen
        return screen

    screen = await assert_eventually(announcement, timeout=60, interval=0.5)
    assert "\x1b" not in screen
    assert "[gastown mail from operator" not in screen.replace("\n", ""), "never as the operator's"
