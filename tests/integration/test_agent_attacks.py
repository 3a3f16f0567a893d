"""Every NATS and git attack a polecat session made work in the red team's run (../shared/research/redteam-turn4.md:
the reply-subject injections T8-T9, the laptop's superuser attacks L3-L10, the limits P20-P21, the pushes to main
G1-G3/L1-L2, the hooks G4/L11 and W1), run from a real polecat pane: the rig's agent command runs
tests/attacks/git_pane.sh and tests/attacks/nats_pane.py, started by the witness in tmux with exactly the session's
environment and credentials, then submits an honest change with `gt done`. Both ways a town runs: `gt up` on a
laptop (its embedded server with the town's accounts) and the compose topology (in containers under podman when it
is ready, else as local processes).

After the attacks the town is unharmed: GT_EVT and GT_CMD are there and hold nothing forged, no forged command has an
outcome, the victim's bead is open, the heartbeats bucket was not purged, the mayor still holds its activity key and
is healthy; the pane saw nothing but its own inbox, its oversized message was refused and its subscriptions capped;
the rig's main and branches are as they were but for the honest change merged through the queue, and no hook the
agent planted (in the rig's repository, in its own workspace's config) ran in the refinery's or the witness's git.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client

from gt.town_secrets import operator_login
from services.refinery.decide import mr_id_for
from services.witness.settings import DEFAULT_TMUX_SOCKET
from shared.core import ids, subjects
from shared.host import git
from tests.attacks import nats_pane
from tests.compose_stack import USERS, ComposeStack, LocalStack, Operator, run_where_agents_run, running_stack
from tests.conftest import REPO_ROOT
from tests.helpers import wait_until
from tests.integration.test_town import TownCli
from tests.log_tools import read_all
from tests.witness_town import make_origin

SCRIPT = Path(nats_pane.__file__)
GIT_SCRIPT = SCRIPT.parent / "git_pane.sh"
FORGED_COMMANDS = (
    "forged-close",
    "forged-unsling",
    "forged-close-plain",
    "forged-cross",
    "huge-1",
    "flood-0",
    "flood-199",
)
REPORT_DEADLINE_S = 180.0
AGENT_UID = 10003
"""The image's user ``agent`` (Dockerfile), whom the compose stack's witness starts agents as."""


def squat_report_of(report: str) -> str:
    return report + ".squat.json"


def agent_command(
    script: str,
    git_script: str,
    report: str,
    git_report: str,
    dumps: str,
    victim: str,
    victim_address: str = "-",
    marker: str = "-",
) -> str:
    """The rig's agent: the git attacks, the NATS attacks, then an honest change submitted with `gt done` (its own
    git with the hooks and fsmonitor it set itself turned off) after taking first the id the refinery will close
    its bead under, and it stays (a pane that ended would be respawned, attacking again). ``victim_address``: a
    polecat whose agent is a shell, mailed subjects that would run ``touch marker`` there."""
    q = shlex.quote
    honest = (
        "echo honest > HONEST.txt && git -c core.fsmonitor=false add HONEST.txt && "
        "git -c core.hooksPath=/dev/null -c core.fsmonitor=false commit -qm honest && "
        f"python {q(script)} --squat {q(squat_report_of(report))} && gt done"
    )
    return (
        f"sh {q(git_script)} {q(git_report)} {q(dumps)}; "
        f"python {q(script)} {q(report)} {q(victim)} {q(victim_address)} {q(marker)}; "
        f"{honest}; sleep 3600"
    )


def assert_rig_unharmed(git_report: str, main_log: list[str], branches: list[str], dumped: list[str]) -> None:
    """The git attacks from the pane: refused, or written where nothing runs them."""
    results = dict(line.split("\t", 1) for line in git_report.splitlines() if "\t" in line)
    assert results.get("done") == "all", git_report
    for attack in ("push-main", "delete-branch", "create-branch"):
        assert results.get(attack) == "refused", (attack, git_report)
    assert "ungated change straight to main" not in main_log, main_log
    assert "honest" in main_log, "the honest change merged through the queue"
    assert "keepme" in branches, branches
    assert "release/1.0" not in branches, branches
    assert dumped == [], f"a hook the agent planted ran in a service's git: {dumped}"


VICTIM_AGENT = "bash --norc -i"
"""The victim session's agent: a shell that runs every line typed into its pane (a nudge, a mail's announcement)."""
PRIVATE_NUDGE = "OPERATOR-PRIVATE-NUDGE the deploy key moved"


def assert_read_nothing_of_others(
    report: dict[str, Any], victim_session: str | None, *, monitoring_reachable: bool = False
) -> None:
    """What the red team read from a pane: every sender's newest outcome by a wildcard direct get, another session's
    record and the operator's nudges through the witness's lists, and the NATS monitoring port (unless
    ``monitoring_reachable``: the stack's nodes as local processes, whose loopback the pane shares, emulating
    containers where a node's monitoring listens on its own loopback)."""
    # Each asks with a wildcard where the session's own token stands: refused, whatever the newest outcome is.
    assert report["outcome_wildcards"] == [], report["outcome_wildcards"]
    lists = report["witness_lists"]
    assert set(lists) == {"sessions", "nudges"}, lists
    for what, answer in lists.items():
        assert PRIVATE_NUDGE not in answer, (what, answer[:2000])
        assert victim_session is None or victim_session not in answer, (what, answer[:2000])
        assert "unauthorized" in answer, (what, answer[:2000])
    if not monitoring_reachable:
        assert report["monitoring"] == [], "the town's NATS monitoring port answered the pane"


def victim_pane_ran_nothing(capture: Callable[[], str], marker: Callable[[], bool], mails: int) -> None:
    """Each mail's announcement was typed into the victim's shell, which refused the line (bash: a syntax error at
    its parenthesis) and ran nothing of the subject."""

    def announced() -> bool:
        return marker() or capture().count("syntax error") >= mails

    wait_until(announced, timeout=REPORT_DEADLINE_S, message="the mails' announcements reached the victim's pane")
    assert not marker(), "a mail's subject ran a command in the victim's pane:\n" + capture()


async def assert_unharmed(
    nc: Client, victim_status: Callable[[], str], report: dict[str, Any], victim_was: str = "open"
) -> None:
    js = nc.jetstream()
    assert (await js.stream_info("GT_EVT")).config.name == "GT_EVT", "the log is there"
    assert (await js.stream_info("GT_CMD")).config.name == "GT_CMD", "the commands are there"
    log = await read_all(nc, "GT_EVT")
    forged = [(seq, subject) for seq, subject, data in log if nats_pane.MARK.encode() in data]
    assert not forged, f"forged events in the log: {forged}"
    for cmd_id in FORGED_COMMANDS:
        try:
            outcome = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}", direct=True)
        except nats.js.errors.NotFoundError:
            continue
        raise AssertionError(f"command {cmd_id} was stored and carried out: {outcome.data!r}")
    assert victim_status() == victim_was, "the victim's bead is as it was"
    # A mail the pane sent naming the victim's bead's id as its new id: refused, nothing written over.
    took = await js.get_last_msg("GT_EVT", subjects.outcome_subject(report["took_id"]), direct=True)
    assert b"cmd.rejected" in (took.data or b""), took.data
    assert b'"conflict"' in (took.data or b""), took.data
    # The heartbeats bucket was not purged: the pane's own key (written by the attack) is still there.
    own = await js.get_last_msg("KV_GT_HEARTBEATS", f"$KV.GT_HEARTBEATS.{report['session']}", direct=True)
    assert own.data, "the session's own heartbeat key survived"
    try:
        other = await js.get_last_msg("KV_GT_HEARTBEATS", "$KV.GT_HEARTBEATS.victim-1", direct=True)
    except nats.js.errors.NotFoundError:
        other = None
    assert other is None, f"another session's heartbeat key was written: {other.data!r}"
    mayor = await js.get_last_msg("KV_GT_ACTIVE", "$KV.GT_ACTIVE.mayor", direct=True)
    assert b"attacker" not in (mayor.data or b""), mayor.data
    # What the pane itself saw: only its own inbox; the huge message cut its connection; subscriptions capped.
    assert report["eavesdropped"] == [], report["eavesdropped"]
    huge = report["limits"]["huge_message"]
    # The server cuts the connection: the client sees its -ERR, or only the reset when that comes first (huge-1
    # is never stored either way: FORGED_COMMANDS).
    cut = ("ayload", "Connection lost", "reset by peer")
    assert huge["closed"] or any(sign in e for e in huge["errors"] for sign in cut), huge
    subs = report["limits"]["subscriptions"]
    assert not subs["connected"] or any("subscriptions" in e.lower() for e in subs["errors"]), subs
    tried = {a["attack"] for a in report["attempts"]}
    assert set(nats_pane.targets("x")) <= tried, tried


async def assert_squat_failed(nc: Client, squat_text: str | None, rig: str, bead: str) -> None:
    """The id the pane took first on its own subject (the refinery's ``close-<mr>`` of its bead) was settled in the
    session's own namespace, and the refinery's close was carried out all the same (the bead is closed: checked by
    the caller), under that id or, found taken, under a fresh one: never the session's mail standing for it."""
    assert squat_text is not None, "the pane took the refinery's id before `gt done`"
    squat = json.loads(squat_text)
    assert squat["taken"] == f"close-{mr_id_for(rig, bead, squat['head'])}", squat
    js = nc.jetstream()
    own_id = ids.session_scoped_id(squat["session"], squat["taken"])
    own = await js.get_last_msg("GT_EVT", subjects.outcome_subject(own_id), direct=True)
    assert b"cmd.accepted" in (own.data or b""), own.data
    try:
        under_taken = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{squat['taken']}", direct=True)
    except nats.js.errors.NotFoundError:
        return
    assert b"squatting" not in (under_taken.data or b""), under_taken.data


async def assert_gated_on_a_runner(nc: Client) -> None:
    """The honest change's gates ran on the town's gate runners: every gate job's answer is a runner's, none the
    pane's (``forge_gate_answer``)."""
    answers = [
        json.loads(data)["data"]
        for _, _, data in await read_all(nc, "GT_EVT", "gt.evt.gate.>")
        if json.loads(data)["type"] == "gate.finished"
    ]
    assert answers, "the gates ran on a runner"
    assert all(a["runner"].startswith("runner-") and a.get("error", "") != nats_pane.MARK for a in answers), answers
    assert any(a["passed"] for a in answers), answers


def gt_status(gt: Operator, bead: str) -> str:
    """The bead's status as the operator's `gt bead show` says."""
    return str(json.loads(gt("bead", "show", bead, "--json"))["status"])


def wait_for_report(read: Callable[[], str | None]) -> dict[str, Any]:
    text = wait_until(read, timeout=REPORT_DEADLINE_S, interval=0.5, message="the pane's attack report")
    assert text is not None
    report: dict[str, Any] = json.loads(text)
    return report


async def test_a_sessions_nats_attacks_from_its_pane_fail_in_the_laptop_town(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    socket = f"gt-attack-{secrets.token_hex(4)}"
    town = TownCli({**gt_env, "GT_TMUX_SOCKET": socket}, tmp_path / "town")
    try:
        # With a gate runner: the honest change's gates run there, and the pane tries to answer a gate job itself.
        up = town("up", "-d", "--port", "0", "--runners", "1")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(tmp_path / "project")
        git.git("branch", "keepme", "main", cwd=origin)
        victim = town("bead", "create", "The victim's work")
        assert victim.returncode == 0, victim.stderr
        victim_id = victim.stdout.strip()
        # The victim: a session of another rig whose agent is a shell, told something private by the operator.
        victim_rig = town("rig", "add", "victim", str(origin), "--agent", VICTIM_AGENT, "--stall-after", "3600")
        assert victim_rig.returncode == 0, victim_rig.stderr
        assert town("sling", victim_id, "victim").returncode == 0

        def victim_session() -> dict[str, Any] | None:
            listed = json.loads(town("session", "list", "--json").stdout)
            return next((s for s in listed if s["bead"] == victim_id and s["status"] == "started"), None)

        victim_seen = await asyncio.to_thread(wait_until, victim_session, timeout=120)
        assert victim_seen is not None
        nudged = town("nudge", victim_seen["id"], PRIVATE_NUDGE)
        assert nudged.returncode == 0, nudged.stderr
        marker = tmp_path / "victim-ran"
        report_path, git_report = tmp_path / "report.json", tmp_path / "git-report.txt"
        dumps = tmp_path / "dumps"
        dumps.mkdir()
        command = agent_command(
            str(SCRIPT),
            str(GIT_SCRIPT),
            str(report_path),
            str(git_report),
            str(dumps),
            victim_id,
            f"polecat:victim/{victim_seen['polecat']}",
            str(marker),
        )
        added = town("rig", "add", "demo", str(origin), "--agent", command)
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "The attacker's bead")
        attacker = bead.stdout.strip()
        slung = town("sling", attacker, "demo")
        assert slung.returncode == 0, slung.stderr
        report = await asyncio.to_thread(
            wait_for_report, lambda: report_path.read_text() if report_path.exists() else None
        )

        def victim_status() -> str:
            shown = town("bead", "show", victim_id, "--json")
            assert shown.returncode == 0, shown.stderr
            status: str = json.loads(shown.stdout)["status"]
            return status

        state = town("health", "mayor")
        assert state.returncode == 0, state.stdout + state.stderr
        login = operator_login(town.home)
        assert login is not None
        url = json.loads((town.home / "run" / "town.json").read_text())["nats_url"]
        nc = await nats.connect(url, user=login[0], password=login[1], inbox_prefix=b"_INBOX_operator")
        try:
            await assert_unharmed(nc, lambda: victim_status(), report, victim_was="hooked")
        finally:
            await nc.close()
        assert town("health", "mayor").returncode == 0, "the mayor is active and healthy"
        assert_read_nothing_of_others(report, victim_seen["id"])

        def victim_screen() -> str:
            name = victim_seen["tmux_name"]
            shown = subprocess.run(
                ["tmux", "-L", socket, "capture-pane", "-p", "-S", "-200", "-t", f"={name}:"],
                capture_output=True,
                text=True,
                check=False,
            )
            return shown.stdout

        assert len(report["mail_ids"]) == len(nats_pane.MAIL_SUBJECTS)
        await asyncio.to_thread(victim_pane_ran_nothing, victim_screen, marker.exists, len(report["mail_ids"]))

        def merged() -> bool:
            shown = town("bead", "show", attacker, "--json")
            return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "closed"

        await asyncio.to_thread(wait_until, merged, timeout=REPORT_DEADLINE_S, message="the honest change merged")
        squat_path = Path(squat_report_of(str(report_path)))
        nc = await nats.connect(url, user=login[0], password=login[1], inbox_prefix=b"_INBOX_operator")
        try:
            squat = squat_path.read_text() if squat_path.exists() else None
            await assert_squat_failed(nc, squat, "demo", attacker)
        finally:
            await nc.close()
        main_log = git.git("log", "--format=%s", "main", cwd=origin).splitlines()
        branches = git.git("for-each-ref", "--format=%(refname:short)", "refs/heads", cwd=origin).split()
        assert_rig_unharmed(git_report.read_text(), main_log, branches, sorted(p.name for p in dumps.iterdir()))
        nc = await nats.connect(url, user=login[0], password=login[1], inbox_prefix=b"_INBOX_operator")
        try:
            await assert_gated_on_a_runner(nc)
        finally:
            await nc.close()
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


@pytest.mark.compose_stack
async def test_a_sessions_nats_attacks_from_its_pane_fail_in_the_compose_topology(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as stack:
        gt = Operator(stack, gt_env, tmp_path / "operator-home")

        where = Path("/var/lib/gastown/attack") if isinstance(stack, ComposeStack) else tmp_path / "attack"

        run_there = functools.partial(run_where_agents_run, stack)

        # The scripts go where the agent runs (onto the gt-home volume, in containers), in a folder of the agents'
        # user (the image's `agent`), where they write their reports.
        run_there("mkdir", "-p", str(where / "dumps"))
        if isinstance(stack, ComposeStack):
            run_there("chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(where))
        for name, text in (("nats_pane.py", SCRIPT.read_text()), ("git_pane.sh", GIT_SCRIPT.read_text())):
            run_there("sh", "-c", f"cat > {shlex.quote(str(where / name))}", stdin=text)
        report_at, git_report_at = where / "report.json", where / "git-report.txt"

        def read(path: Path) -> str | None:
            try:
                text = run_there("cat", str(path))
            except (AssertionError, subprocess.CalledProcessError):
                return None
            return text or None

        origin = stack.make_origin()
        run_there("git", "--git-dir", origin, "branch", "keepme", "main")
        victim = gt("bead", "create", "The victim's work")
        # The victim: a session of another rig whose agent is a shell, told something private by the operator.
        gt("rig", "add", "victim", origin, "--agent", VICTIM_AGENT, "--stall-after", "3600")
        gt("sling", victim, "victim")

        def victim_session() -> dict[str, Any] | None:
            listed = json.loads(gt("session", "list", "--json"))
            return next((s for s in listed if s["bead"] == victim and s["status"] == "started"), None)

        victim_seen = await asyncio.to_thread(wait_until, victim_session, timeout=180)
        assert victim_seen is not None
        gt("nudge", victim_seen["id"], PRIVATE_NUDGE)
        marker = where / "victim-ran"
        command = agent_command(
            str(where / "nats_pane.py"),
            str(where / "git_pane.sh"),
            str(report_at),
            str(git_report_at),
            str(where / "dumps"),
            victim,
            f"polecat:victim/{victim_seen['polecat']}",
            str(marker),
        )
        gt("rig", "add", "demo", origin, "--agent", command)
        attacker = gt("bead", "create", "The attacker's bead")
        gt("sling", attacker, "demo")
        try:
            report = await asyncio.to_thread(wait_for_report, lambda: read(report_at))
        except AssertionError:
            print(stack.log_tail("witness", 60))
            print(gt("session", "list", "--all"))
            raise
        nc = await nats.connect(
            servers=stack.urls(), user="operator", password=passwords["operator"], inbox_prefix=b"_INBOX_operator"
        )
        try:
            await assert_unharmed(nc, lambda: gt_status(gt, victim), report, victim_was="hooked")
        finally:
            await nc.close()
        assert_read_nothing_of_others(report, victim_seen["id"], monitoring_reachable=isinstance(stack, LocalStack))
        pane = ["capture-pane", "-p", "-S", "-200", "-t", f"={victim_seen['tmux_name']}:"]

        def victim_screen() -> str:
            if isinstance(stack, ComposeStack):
                return stack.exec("witness", "tmux", "-L", DEFAULT_TMUX_SOCKET, *pane)
            assert isinstance(stack, LocalStack)
            shown = subprocess.run(
                ["tmux", "-L", stack.tmux_socket, *pane], capture_output=True, text=True, check=False
            )
            return shown.stdout

        def ran() -> bool:
            return run_there("sh", "-c", f"test -e {shlex.quote(str(marker))} && echo ran || true").strip() == "ran"

        await asyncio.to_thread(victim_pane_ran_nothing, victim_screen, ran, len(report["mail_ids"]))
        if isinstance(stack, ComposeStack):
            # In containers agents run as the image's user `agent` (GT_AGENT_USER), not the witness's root.
            assert report["uid"] == AGENT_UID, report["uid"]
        gt("health", "mayor")

        def merged() -> bool:
            return bool(json.loads(gt("bead", "show", attacker, "--json"))["status"] == "closed")

        await asyncio.to_thread(wait_until, merged, timeout=REPORT_DEADLINE_S, message="the honest change merged")
        nc = await nats.connect(
            servers=stack.urls(), user="operator", password=passwords["operator"], inbox_prefix=b"_INBOX_operator"
        )
        try:
            await assert_squat_failed(nc, read(Path(squat_report_of(str(report_at)))), "demo", attacker)
        finally:
            await nc.close()
        main_log = run_there("git", "--git-dir", origin, "log", "--format=%s", "main").splitlines()
        branches = run_there("git", "--git-dir", origin, "for-each-ref", "--format=%(refname:short)", "refs/heads")
        dumped = sorted(run_there("ls", str(where / "dumps")).split())
        git_report = read(git_report_at) or ""
        assert_rig_unharmed(git_report, main_log, branches.split(), dumped)
        if isinstance(stack, ComposeStack):
            assert "plant-hook\trefused" in git_report, "the agents' user cannot write the rig's repository"
        nc = await nats.connect(
            servers=stack.urls(), user="operator", password=passwords["operator"], inbox_prefix=b"_INBOX_operator"
        )
        try:
            await assert_gated_on_a_runner(nc)
        finally:
            await nc.close()
