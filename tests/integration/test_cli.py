"""The `gt` command as operators run it: a subprocess against a real server and a running mayor."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.mayor.service import MayorService
from shared.bus.commands import LIVENESS_TIMEOUT_S
from shared.bus.topology import evt_stream_config
from shared.core.config import TownConfig
from shared.model.commands import COMMANDS
from tests.helpers import assert_eventually
from tests.integration.test_mayor_service import run_mayor
from tests.service_process import ServiceProcess


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Gt:
    """Runs `gt ...` as a subprocess with NATS_URL pointing at the test's server."""

    def __init__(self, env: dict[str, str], town: TownConfig) -> None:
        self.env = {**env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home)}

    async def __call__(self, *args: str, timeout: float = 60, stdin: bytes | None = None) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gt.cli.main",
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        assert proc.returncode is not None
        return Run(proc.returncode, out.decode(), err.decode())


@pytest.fixture
def gt(gt_env: dict[str, str], town: TownConfig) -> Gt:
    return Gt(gt_env, town)


@pytest.fixture
async def mayor(town: TownConfig) -> AsyncIterator[MayorService]:
    async with run_mayor(town) as service:
        yield service


async def test_the_bead_lifecycle_through_the_cli(gt: Gt, mayor: MayorService) -> None:
    created = await gt("bead", "create", "Fix the frobulator", "-p", "1", "-l", "backend", "--meta", "ticket=T-7")
    assert created.code == 0, created.err
    bead_id = created.out.strip()
    assert bead_id.startswith("hq-")

    shown = await gt("bead", "show", bead_id)
    assert shown.code == 0
    assert "Fix the frobulator" in shown.out
    assert "status:    open" in shown.out
    assert "ticket=T-7" in shown.out

    assert (await gt("bead", "update", bead_id, "--label", "urgent", "--remove-label", "backend")).code == 0
    claimed = await gt("bead", "claim", bead_id, "--assignee", "polecat:demo/ace")
    assert (claimed.code, claimed.out.strip()) == (0, f"{bead_id}: in_progress")
    closed = await gt("bead", "close", bead_id, "--reason", "merged")
    assert (closed.code, closed.out.strip()) == (0, f"{bead_id}: closed")
    again = await gt("bead", "close", bead_id)
    assert (again.code, again.out.strip()) == (0, f"{bead_id}: closed (unchanged)")

    bead = (await gt("bead", "show", bead_id, "--json")).json()
    assert (bead["status"], bead["labels"], bead["close_reason"]) == ("closed", ["urgent"], "merged")

    history = await gt("bead", "history", bead_id, "--raw")
    assert history.code == 0
    lines = history.out.strip().splitlines()
    assert [line.split()[3] for line in lines] == ["bead.created", "bead.updated", "bead.claimed", "bead.closed"]
    entries = (await gt("bead", "history", bead_id, "--json")).json()
    assert [e["type"] for e in entries] == ["bead.created", "bead.updated", "bead.claimed", "bead.closed"]
    assert all(e["causation_id"] for e in entries)


async def test_list_ready_and_filters(gt: Gt, mayor: MayorService) -> None:
    blocker = (await gt("bead", "create", "blocker")).out.strip()
    blocked = (await gt("bead", "create", "blocked", "--needs", blocker, "-t", "bug")).out.strip()
    listed = await gt("bead", "list")
    assert listed.code == 0
    assert listed.out.splitlines()[0].split() == ["ID", "STATUS", "PRI", "TYPE", "ASSIGNEE", "TITLE"]
    assert [row.split()[0] for row in listed.out.splitlines()[1:]] == [blocker, blocked]
    assert [b["id"] for b in (await gt("ready", "--json")).json()] == [blocker]
    assert [b["id"] for b in (await gt("bead", "list", "--type", "bug", "--json")).json()] == [blocked]
    await gt("bead", "close", blocker)
    assert [b["id"] for b in (await gt("ready", "--json")).json()] == [blocked]
    assert [b["id"] for b in (await gt("bead", "list", "--json")).json()] == [blocked]
    assert len((await gt("bead", "list", "--all", "--json")).json()) == 2
    assert (await gt("bead", "list", "--label", "none")).out.strip() == "(no beads)"


async def test_a_rejection_exits_1_with_the_reason(gt: Gt, mayor: MayorService) -> None:
    bead_id = (await gt("bead", "create", "t")).out.strip()
    await gt("bead", "close", bead_id)
    run = await gt("bead", "claim", bead_id, "-a", "x")
    assert run.code == 1
    assert "backward_transition" in run.err
    assert (await gt("bead", "create", "t", "-p", "9")).code == 1
    missing = await gt("bead", "show", "hq-nothere")
    assert missing.code == 1
    assert "not_found" in missing.err
    rejected = await gt("bead", "close", "hq-nothere", "--json")
    assert rejected.code == 1
    assert rejected.json()["data"]["code"] == "not_found"
    assert (await gt("bead", "history", "hq-nothere")).code == 1


async def test_a_sling_naming_no_agent_runtime_is_refused_in_one_line_that_names_them_and_stores_nothing(
    gt: Gt, town: TownConfig, nc: Client, mayor: MayorService
) -> None:
    bead_id = (await gt("bead", "create", "t")).out.strip()
    js = nc.jetstream()
    stored = (await js.stream_info(town.cmd_stream)).state.last_seq
    run = await gt("sling", bead_id, "demo", "--agent", "codx")
    assert (run.code, run.out) == (1, ""), run
    assert run.err.strip() == (
        "gt: refused (invalid): `agent` 'codx' is not an agent runtime; the runtimes: claude, codex, gemini, gt-agent, "
        "opencode (a command line of your own is a rig's agent: `gt rig add --agent`); nothing was sent"
    )
    assert (await js.stream_info(town.cmd_stream)).state.last_seq == stored, "nothing was stored"
    assert (await gt("bead", "show", bead_id, "--json")).json()["status"] == "open"


async def test_actor_is_taken_before_the_command_as_after_it(gt: Gt, mayor: MayorService) -> None:
    bead_id = (await gt("bead", "create", "t")).out.strip()
    closed = await gt("--actor", "operator:max", "bead", "close", bead_id, "--reason", "done by max")
    assert closed.code == 0, closed.err
    raw = (await gt("bead", "history", bead_id, "--raw")).out
    assert [line for line in raw.splitlines() if "bead.closed" in line and "by operator:max" in line], raw
    listing = await gt("--actor", "operator:max", "bead", "list")
    assert listing.code == 2
    assert "--actor names who sends a command; `gt bead list` sends none" in listing.err


async def test_usage_errors_exit_2(gt: Gt) -> None:
    assert (await gt("bead", "frobnicate")).code == 2
    assert (await gt("bead", "create")).code == 2
    bad_meta = await gt("bead", "create", "t", "--meta", "novalue")
    assert bad_meta.code == 2
    assert "KEY=VALUE" in bad_meta.err


async def test_nats_unreachable_exits_3(gt: Gt) -> None:
    started = time.monotonic()
    run = await gt("bead", "list", "--nats-url", "nats://127.0.0.1:1")
    assert run.code == 3
    assert "unreachable" in run.err
    assert time.monotonic() - started < 30


async def test_a_town_not_provisioned_is_said_in_words_and_exits_3(gt: Gt, town: TownConfig, nc: Client) -> None:
    # The NATS client's errors for "no such stream" and "no stream takes the subject" reach the operator as the
    # project's own (shared.bus.errors.map_errors), with what to do, never as a traceback.
    no_command = "gt: no stream takes commands yet (nothing was stored); run `gt init` or `gt up`, then retry"
    nothing = await gt("bead", "create", "before init")
    said = nothing.err.strip().splitlines()[-1]  # after any log lines of the client's
    assert (nothing.code, said) == (3, no_command)
    no_log = await gt("feed", "--no-follow")
    said = no_log.err.strip().splitlines()[-1]
    assert (no_log.code, said) == (3, "gt: not found: stream not found; run `gt init` (or `gt up`) first")
    await nc.jetstream().add_stream(evt_stream_config(town))  # the log, but no command intake yet
    no_intake = await gt("bead", "create", "before the intake")
    assert no_intake.code == 3
    assert no_intake.err.strip().splitlines()[-1] == no_command


async def test_a_command_stored_while_the_mayor_is_down_says_so_and_exits_0(
    gt: Gt, town: TownConfig, nc: Client
) -> None:
    assert (await gt("init")).code == 0
    stored = await gt("bead", "create", "queued while down", "--id", "down-1")
    assert stored.code == 0
    assert re.fullmatch(r"hq-[0-9a-z]{6}\n", stored.out), stored.out  # the answer: the bead's id, chosen by gt
    assert "durably queued" in stored.err
    assert "not running" in stored.err
    closed = await gt("bead", "close", "hq-000000", "--id", "down-2")  # no id to tell: nothing on stdout
    assert (closed.code, closed.out) == (0, ""), closed
    assert "durably queued" in closed.err
    # Every command that creates something prints the id it will have.
    convoy = await gt("convoy", "create", "queued convoy")
    escalation = await gt("escalate", "queued escalation")
    mail = await gt("mail", "send", "operator:ann", "--body", "queued mail")
    for run, prefix in ((convoy, "cv"), (escalation, "esc"), (mail, "hq")):
        assert run.code == 0, run.err
        assert re.fullmatch(rf"{prefix}-[0-9a-z]{{6}}\n", run.out), run.out
        assert "durably queued" in run.err
    # --json too: a script reads the id it will have without an answer (the trial found none in it).
    as_json = await gt("bead", "create", "queued as json", "--json")
    assert as_json.code == 0, as_json.err
    queued = as_json.json()
    assert (queued["service_down"], queued["type"]) == (True, None), queued
    assert re.fullmatch(r"hq-[0-9a-z]{6}", queued["new_id"]), queued
    waiting = asyncio.ensure_future(gt("bead", "create", "waited for", "--wait"))
    async with run_mayor(town):
        waited = await waiting
        assert waited.code == 0, waited.err
        assert waited.out.strip().startswith("hq-")
        titles = [b["title"] for b in (await gt("bead", "list", "--json")).json() if b["type"] != "message"]
        assert titles == ["queued while down", "queued as json", "waited for"]
        assert (await gt("bead", "show", queued["new_id"], "--json")).json()["title"] == "queued as json"
        assert (await gt("bead", "show", stored.out.strip(), "--json")).json()["title"] == "queued while down"
        assert (await gt("convoy", "status", convoy.out.strip(), "--json")).json()["title"] == "queued convoy"
        escalations = (await gt("escalations", "--json")).json()
        assert [e["id"] for e in escalations] == [escalation.out.strip()]
        assert (await gt("mail", "read", mail.out.strip(), "--json")).json()["description"] == "queued mail"


async def test_a_bead_created_while_the_mayor_is_killed_prints_its_id_and_is_created_once(
    gt: Gt, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 39: with the mayor killed, `id=$(gt bead create ...)` held a sentence ("stored: command cli-... is
    durably queued ...") and exited 0, so a script went on with it as the bead's id. Now gt chooses the bead's id,
    prints it (the explanation goes to stderr), and the mayor creates the bead under it, once, when it is back."""
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home)}
    mayor = ServiceProcess("mayor", env, tmp_path / "mayor.log")
    mayor.start()
    try:
        await assert_eventually(lambda: mayor.logged("activity_acquired"), timeout=60, interval=0.1)
        mayor.kill()  # kill -9
        # The trial's command, as a script runs it.
        script = (
            f'id=$({sys.executable} -m gt.cli.main bead create "made while the mayor is down" -l trial); rc=$?; '
            'printf "%s|%s" "$rc" "$id"'
        )
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", script, env=gt.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        rc, bead = out.decode().split("|")
        assert rc == "0", err.decode()
        assert re.fullmatch(r"hq-[0-9a-z]{6}", bead), bead
        assert "the mayor is not running" in err.decode()
        assert f"{bead} is created when it does" in err.decode()
        # A script goes on with it at once: the next command on the bead queues behind its creation.
        updated = await gt("bead", "update", bead, "-p", "1")
        assert updated.code == 0, updated.err

        mayor.start()

        async def shown() -> bool:
            run = await gt("bead", "show", bead, "--json")
            return run.code == 0 and run.json()["priority"] == 1

        updated_once: bool = await assert_eventually(shown, timeout=120, interval=0.5)
        assert updated_once
        assert (await gt("bead", "show", bead, "--json")).json()["title"] == "made while the mayor is down"
        listed = (await gt("bead", "list", "--label", "trial", "--json")).json()
        assert [b["id"] for b in listed] == [bead], "created once"
    finally:
        mayor.stop()


async def test_a_command_that_succeeds_prints_nothing_on_stderr_even_with_info_logging(
    gt: Gt, mayor: MayorService
) -> None:
    """Issue 29: every `gt` call against the compose stack (GT_LOG_LEVEL=INFO in its .env) ended with
    `[warning] nats_disconnected`: nats-py reports its own close as a disconnect."""
    assert gt.env["GT_LOG_LEVEL"] == "INFO"
    for args in (("bead", "create", "quiet"), ("ready",), ("bead", "list")):
        run = await gt(*args)
        assert run.code == 0, run.err
        assert run.err == "", (args, run.err)


async def test_a_command_to_a_mayor_too_busy_to_answer_its_status_query_waits_for_its_outcome(
    gt: Gt, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Found when a loaded machine ran the Claude Code tests: `gt step done` said "the mayor is not running" of a
    running mayor that took over two seconds to answer, and gave up on an outcome that came a moment later. Only
    nobody subscribing counts as down; a frozen mayor (SIGSTOP) stands for one that is slow."""
    mayor = ServiceProcess(
        "mayor", {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home)}, tmp_path / "mayor.log"
    )
    mayor.start()
    try:
        await assert_eventually(lambda: mayor.logged("activity_acquired"), timeout=60, interval=0.1)
        mayor.signal(signal.SIGSTOP)
        sent = asyncio.ensure_future(gt("bead", "create", "sent to a busy mayor", "--id", "busy-1"))
        await asyncio.sleep(LIVENESS_TIMEOUT_S + 1)  # its status query has gone unanswered
        assert not sent.done(), (await sent).out
        mayor.signal(signal.SIGCONT)
        created = await sent
        assert created.code == 0, created.err
        assert re.fullmatch(r"hq-[0-9a-z]{6}", created.out.strip()), created.out  # its id: the mayor answered
    finally:
        mayor.stop()


async def test_health_and_init(gt: Gt, town: TownConfig) -> None:
    first = await gt("init")
    assert first.code == 0
    assert "created  GT_EVT" in first.out
    assert "exists   GT_EVT" in (await gt("init")).out
    down = await gt("health")
    assert down.code == 3
    assert "not running" in down.err
    async with run_mayor(town):
        healthy = await gt("health", "--json")
        assert healthy.code == 0
        status = healthy.json()
        assert (status["caught_up"], status["connected"], status["lag"]) == (True, True, 0)


async def test_schema_lists_every_command_and_event(gt: Gt) -> None:
    run = await gt("schema")
    assert run.code == 0
    schema = run.json()
    assert set(schema["commands"]) == set(COMMANDS)
    assert {"gt.cmd.bead.sling", "gt.cmd.step.done", "gt.cmd.convoy.land", "gt.cmd.mail.send"} <= set(COMMANDS)
    assert {"bead.created", "bead.closed", "cmd.accepted", "cmd.rejected"} <= set(schema["events"])
    assert schema["events"]["bead.created"]["subject"] == "gt.evt.bead.<id>"


async def test_formulas_sling_and_steps_through_the_cli(gt: Gt, mayor: MayorService) -> None:
    listed = await gt("formula", "list")
    assert listed.code == 0
    assert "polecat-work" in listed.out
    assert "builtin" in listed.out
    shown = await gt("formula", "show", "code-review", "--var", "change=mr-9")
    assert shown.code == 0
    assert "verdict: Give a verdict on mr-9" in shown.out
    bead_id = (await gt("bead", "create", "Widget")).out.strip()
    slung = await gt("sling", bead_id, "demo")
    assert slung.code == 0, slung.err
    assert slung.out.startswith(f"{bead_id}: hooked on demo, molecule polecat-work, convoy cv-")
    assert (await gt("sling", bead_id, "demo")).code == 1  # already hooked: conflict
    done = await gt("step", "done", bead_id, "load-context")
    assert (done.code, done.out.strip()) == (0, f"{bead_id} load-context: done (1/6 done)")
    status = await gt("mol", "status", bead_id)
    assert status.code == 0
    assert "current step: implement" in status.out
    assert "[x] load-context" in status.out
    assert "[ ] implement" in status.out
    premature = await gt("step", "done", bead_id, "submit")
    assert premature.code == 1
    assert "needs run-tests done first" in premature.err
    molecule = (await gt("mol", "status", bead_id, "--json")).json()
    assert (molecule["done"], molecule["total"]) == (1, 6)


async def test_convoys_through_the_cli(gt: Gt, mayor: MayorService) -> None:
    a = (await gt("bead", "create", "a")).out.strip()
    b = (await gt("bead", "create", "b")).out.strip()
    created = await gt("convoy", "create", "Release 1", a, "--owned")
    assert created.code == 0
    convoy_id = created.out.strip()
    assert re.fullmatch(r"cv-[0-9a-z]+", convoy_id), f"a create prints the new id alone: {created.out!r}"
    assert "0/1" in (await gt("convoy", "status", convoy_id)).out
    assert (await gt("convoy", "add", convoy_id, b)).out.strip() == f"{convoy_id}: open, 0/2 closed"
    await gt("bead", "close", a)
    status = await gt("convoy", "status", convoy_id)
    assert "1/2" in status.out
    assert "owned" in status.out
    refused = await gt("convoy", "land", convoy_id)
    assert refused.code == 1
    assert "open beads" in refused.err
    assert (await gt("convoy", "land", convoy_id, "--force")).code == 0
    assert (await gt("convoy", "list")).out.strip() == "(no convoys)"
    assert convoy_id in (await gt("convoy", "list", "--all")).out


async def test_mail_and_escalations_through_the_cli(gt: Gt, mayor: MayorService) -> None:
    sent = await gt(
        "mail", "send", "mayor", "--subject", "Deploy?", "--body", "Can we deploy today?", "--actor", "operator:ann"
    )
    assert sent.code == 0, sent.err
    message_id = sent.out.split(":")[0]
    inbox = await gt("mail", "inbox", "mayor")
    assert message_id in inbox.out
    assert "operator:ann" in inbox.out
    read = await gt("mail", "read", message_id)
    assert read.code == 0
    assert "Can we deploy today?" in read.out
    assert (await gt("mail", "inbox", "mayor")).out.strip() == "(no messages)"
    # An operator labels itself, but never as a service: who acted is decided by the subject, not the body.
    posing = await gt("mail", "reply", message_id, "--body", "Yes", "--actor", "mayor")
    assert posing.code == 1, posing
    assert "rejected (unauthorized)" in posing.err
    replied = await gt("mail", "reply", message_id, "--body", "Yes", "--actor", "operator:max")
    assert replied.code == 0
    assert "sent to operator:ann" in replied.out
    thread = await gt("mail", "thread", message_id)
    assert "operator:ann -> mayor: Deploy?" in thread.out
    assert "operator:max -> operator:ann: Re: Deploy?" in thread.out
    assert (await gt("mail", "archive", message_id)).code == 0

    raised = await gt("escalate", "main is red", "--severity", "high", "--source", "refinery")
    assert raised.code == 0
    escalation_id = raised.out.strip()
    assert re.fullmatch(r"esc-[0-9a-z]+", escalation_id), f"a create prints the new id alone: {raised.out!r}"
    listed = await gt("escalations")
    assert escalation_id in listed.out
    assert "high" in listed.out
    assert (await gt("escalation", "ack", escalation_id)).out.strip() == f"{escalation_id}: acked"
    assert (await gt("escalation", "close", escalation_id, "--reason", "fixed")).code == 0
    assert (await gt("escalations")).out.strip() == "(no escalations)"
    bad = await gt("escalate", "x", "--severity", "urgent")
    assert bad.code == 2


async def test_every_oversized_input_gets_one_line_and_stores_nothing(
    gt: Gt, town: TownConfig, nc: Client, mayor: MayorService
) -> None:
    """Issue 39: a 5 MB mail body gave 66 lines of traceback (`nats.errors.MaxPayloadError`). Every input over a
    limit is refused before anything is sent, in one line that names the limit, exit 1, GT_CMD untouched."""
    js = nc.jetstream()

    async def stored() -> int:
        return int((await js.stream_info(town.cmd_stream)).state.last_seq)

    before = await stored()
    mib5 = b"x" * (5 * 1024 * 1024)
    meta = [arg for i in range(20) for arg in ("--meta", f"k{i}={'m' * 60_000}")]  # 1.2 MB: each value fits
    cases = {
        "a 5 MB mail body": (("mail", "send", "operator:ann", "--subject", "big5m"), mib5, "`body` (standard input)"),
        "a 900 KB mail body": (("mail", "send", "operator:ann"), b"y" * 900_000, "`body` (standard input)"),
        "a 5 MB reply": (("mail", "reply", "hq-000000"), mib5, "`body` (standard input)"),
        "a 100 KB title": (("bead", "create", "t" * 100_000), None, "`title` is 100000 characters; the limit is 500"),
        "1.2 MB of metadata": (("bead", "create", "much metadata", *meta), None, "the limit is 1048576"),
    }
    for what, (args, stdin, says) in cases.items():
        run = await gt(*args, stdin=stdin)
        assert run.code == 1, (what, run)
        assert run.out == "", what
        lines = run.err.strip().splitlines()
        assert len(lines) == 1, (what, run.err[:2000])
        assert lines[0].startswith("gt: refused ("), (what, lines)
        assert says in lines[0], (what, lines)
        assert lines[0].endswith("nothing was sent"), (what, lines)
    assert await stored() == before, "nothing was stored"
    # Under every limit, the same path sends it.
    sent = await gt("mail", "send", "operator:ann", stdin=b"z" * 200_000)
    assert sent.code == 0, sent.err
