"""Attacks on the gate runners from a real polecat pane (tests/attacks/gate_pane.py, started by the witness in tmux with
exactly the session's environment), in the laptop town `gt up --runners 1` runs.

A rig's agent commits a red change and submits it with `gt done`; another session of the rig (the watcher) waits in its
pane for the gate job of that change and

(a) appends the job's answer itself, ``gate.started`` and a ``gate.finished`` that passed, with its own NATS
    credentials: refused (a session may publish no event; ``gt.evt.gate.>`` is the runners' and the refinery's);
(b) swaps the candidate: it pushes the green commit below the red one to ``refs/gt/gate/<job>`` in the rig's repository,
    which on a laptop it can write (the same OS user as the town). The runner fetches the job by that ref and finds it
    naming another commit than the job's: the job finishes with an error, nobody is blamed, the batch goes back into
    the queue, is gated again on candidates the refinery pushed anew, and the red change fails its gate: it never
    lands. The green change queued with it lands.

The window is held open for the watcher: the refinery gates two candidates at once (GT_MQ_RUNNERS=2 set by the
operator) on the town's one runner, and the first candidate's test gate waits for a file the test removes once the
watcher reported, so the red candidate's job waits for the runner meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

from gt.town.state import read_state
from gt.town_secrets import operator_login
from shared.bus import commands as bus_commands
from shared.bus.connection import close_quietly, connect
from shared.core.config import TownConfig
from shared.host import git
from shared.model.commands import MergeRequestSubmit
from tests.attacks import gate_pane
from tests.helpers import LINGERING_AGENTS, wait_until
from tests.integration.test_town import TownCli
from tests.integration.test_town_runners import gate_events
from tests.witness_town import IDENTITY, make_origin

SCRIPT = Path(gate_pane.__file__)
REPORT_DEADLINE_S = 240.0


def submit_as_operator(town: TownCli, bead: str, branch: str, head: str) -> None:
    """A merge request queued by the operator (``mr.submit``), as a person's branch would be."""
    state = read_state(town.config)
    login = operator_login(town.home)
    assert state is not None
    assert login is not None
    config = TownConfig(nats_url=state.nats_url, gt_home=town.home, nats_user=login[0], nats_password=login[1])

    async def send() -> None:
        nc = await connect(config, name="test-operator")
        try:
            cmd = MergeRequestSubmit(bead=bead, rig="demo", branch=branch, head=head, cmd_id=f"t-{bead}")
            outcome = await bus_commands.send(nc, config, cmd, timeout=60, wait_if_down=True)
            assert outcome.type == "cmd.accepted", outcome
        finally:
            await close_quietly(nc)

    asyncio.run(send())


def push_branch(origin: Path, branch: str, files: dict[str, str]) -> str:
    clone = origin.parent / f"scratch-{secrets.token_hex(4)}"
    git.git("clone", "--quiet", "--branch", "main", str(origin), str(clone))
    try:
        git.git("checkout", "--quiet", "-b", branch, cwd=clone)
        for name, text in files.items():
            (clone / name).write_text(text)
        git.git("add", "-A", ".", cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", f"{branch}: {', '.join(files)}", cwd=clone)
        git.git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=clone)
        return git.git("rev-parse", "HEAD", cwd=clone).strip()
    finally:
        git.force_remove(clone)


def mr_events(url: str, home: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every merge request event of the log: (type, payload)."""

    async def read() -> list[tuple[str, dict[str, Any]]]:
        from tests.integration.test_town import _as_operator
        from tests.log_tools import read_all

        nc = await _as_operator(url, home)
        try:
            stored = await read_all(nc, "GT_EVT", "gt.evt.mr.>")
        finally:
            await nc.close()
        return [(json.loads(data)["type"], json.loads(data)["data"]) for _, _, data in stored]

    return asyncio.run(read())


def test_an_agent_can_neither_answer_a_gate_job_nor_swap_its_candidate_to_land_a_red_change(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    socket = f"gt-gate-attack-{secrets.token_hex(4)}"
    hold = tmp_path / "HOLD"
    hold.touch()
    env = {
        **gt_env,
        **LINGERING_AGENTS,
        "GT_TMUX_SOCKET": socket,
        # Two candidates gated at once, on the one runner: the second one's job waits while the first one runs.
        "GT_MQ_RUNNERS": "2",
        "GT_MQ_BATCH": "2",
        "GT_MQ_BATCH_WAIT": "120",
        "GT_MQ_ORDER": "fifo",
    }
    town = TownCli(env, tmp_path / "town")
    try:
        up = town("up", "-d", "--port", "0", "--runners", "1")
        assert up.returncode == 0, up.stderr + up.stdout
        state = read_state(town.config)
        assert state is not None
        origin = make_origin(tmp_path / "project")
        watcher = town("bead", "create", "The watcher", "--prefix", "demo", "--wait").stdout.strip()
        report_path = tmp_path / "gate-report.json"
        command = f"python {SCRIPT} {report_path} {origin} {watcher}; sleep 3600"
        # Red on the file the author commits; the first candidate's test waits while HOLD is there.
        test = f"! ls FAIL_* >/dev/null 2>&1 && while [ -e {hold} ]; do sleep 0.2; done"
        added = town("rig", "add", "demo", str(origin), "--test", test, "--agent", command, "--wait")
        assert added.returncode == 0, added.stderr
        assert town("sling", watcher, "demo", "--wait").returncode == 0

        # First in the queue (fifo): an operator's green change; then the agent's red one.
        blocker = town("bead", "create", "The green change", "--prefix", "demo", "--wait").stdout.strip()
        branch = f"polecat/operator/{blocker}"
        submit_as_operator(town, blocker, branch, push_branch(origin, branch, {"green.txt": "green\n"}))
        red = town("bead", "create", "The red change", "--prefix", "demo", "--wait").stdout.strip()
        assert town("sling", red, "demo", "--wait").returncode == 0

        text = wait_until(
            lambda: report_path.read_text() if report_path.exists() else None,
            timeout=REPORT_DEADLINE_S,
            interval=0.5,
            message="the watcher's report",
        )
        assert text is not None
        report = json.loads(text)
        assert "error" not in report, report
        # (a) Every answer it wrote itself was refused by NATS. (The server checks no reply subject: the answer to its
        # own command went to the job's subject of its own account, which reaches nothing of the town: judged by the
        # log below.)
        assert len(report["forged"]) == 6, report["forged"]
        for attempt in report["forged"]:
            if attempt["how"] == "reply of its own command":
                assert attempt["result"] == "sent", attempt
            else:
                assert "permissions violation" in attempt["result"].lower(), attempt
                assert f"gt.evt.gate.{report['swap']['job']}" in attempt["result"], attempt
        # (b) The swap itself worked: the job's ref names the green commit below the red one now.
        swap = report["swap"]
        assert swap["pushed"], swap
        assert swap["now"] == swap["green"] != swap["candidate"], swap
        job = swap["job"]

        hold.unlink()  # the first candidate's gate ends; the runner takes the red one's job next

        def gates_done() -> bool:
            shown = town("bead", "show", blocker, "--json")
            return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "closed"

        wait_until(gates_done, timeout=240, interval=0.5, message="the green change landed")
        events = gate_events(state.nats_url, town.home)
        answers = [data for kind, data in events if kind == "gate.finished" and data["job_id"] == job]
        assert len(answers) == 1, answers
        assert not answers[0]["passed"]
        assert f"names {swap['green']}" in answers[0]["error"], answers[0]
        assert f"not the candidate {swap['candidate']}" in answers[0]["error"], answers[0]
        assert not answers[0].get("results"), "no gate ran on the swapped commit"
        runners = {data["runner"] for kind, data in events if kind in ("gate.started", "gate.finished")}
        assert runners == {"runner-1"}, runners
        assert gate_pane.MARK.encode() not in json.dumps(events).encode()
        # The batch went back and was gated again: the red change failed its test gate there.
        red_candidates = [
            data["job_id"]
            for kind, data in events
            if kind == "gate.requested" and data["job_id"] != job and len(data.get("stack", [])) == 2
        ]
        assert red_candidates, "the red candidate was asked again, under a job of its own"
        mrs = mr_events(state.nats_url, town.home)
        submitted = {data["mr_id"]: data["bead"] for kind, data in mrs if kind == "mr.submitted"}
        failed = [data for kind, data in mrs if kind == "mr.failed" and submitted.get(data["mr_id"]) == red]
        assert [f["gate"] for f in failed][:1] == ["test"], failed
        merged = [submitted.get(data["mr_id"]) for kind, data in mrs if kind == "mr.merged"]
        assert red not in merged
        assert blocker in merged
        files = git.git("ls-tree", "-r", "--name-only", "main", cwd=origin).split()
        assert "green.txt" in files
        assert gate_pane.RED_FILE not in files, "the red change never landed"
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
