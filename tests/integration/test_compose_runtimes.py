"""Every agent runtime in the compose stack's image works a bead to merged: the image built with Claude Code, Codex CLI,
Gemini CLI and OpenCode at their pinned versions (``GT_CLAUDE_CODE_VERSION``, ``GT_CODEX_VERSION``,
``GT_GEMINI_CLI_VERSION``, ``GT_OPENCODE_VERSION``: ops/<name>.version), each pointed by its vendor's variables,
passed through to the witness, at the scripted model server in the witness's container (``python -m
gt.model_server`` on its loopback, every vendor's API). One rig per runtime on the gt-home volume; the witness starts
each runtime in its container as the image's user ``agent``; each is primed by its start hook, writes a file with its
own tools, commits, is sent on by its stop hook while steps are open, marks every step done and runs ``gt done``; the
refinery merges all four into the rig's repository. Needs the stack in containers, as test_compose_lifecycle.py does;
the same story on a laptop town is tests/integration/test_runtime_conformance.py."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from gt.model_server import Script
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.compose_stack import (
    ORIGIN_ON_VOLUME,
    USERS,
    ComposeStack,
    Operator,
    model_server_where_agents_run,
    podman_compose_ready,
    running_stack,
    runtimes_compose_env,
)
from tests.conftest import REPO_ROOT
from tests.helpers import wait_until
from tests.integration import test_runtime_conformance as conformance

pytestmark = pytest.mark.skipif(
    not podman_compose_ready(), reason="the stack in containers needs rootful podman (./dev test sets it up as root)"
)


def worktree(rig: str) -> str:
    """The rig's first polecat's worktree in the witness's container (the story's Write takes an absolute path)."""
    return f"/var/lib/gastown/rigs/{rig}/polecats/ace"


def feature(cli: AgentCli) -> str:
    return f"feature-{cli.name}.txt"


def worked_story(cli: AgentCli) -> Script:
    """A bead worked to merged, as test_runtime_conformance.py's, writing a file of the runtime's own."""
    return conformance.worked_story(
        f"{cli.name}-compose", cli.name, worktree(cli.name), file=feature(cli), text=f"written by {cli.name}\n"
    )


@pytest.mark.compose_stack
@pytest.mark.timeout(1800)
def test_each_runtime_in_the_image_works_a_bead_to_merged_in_the_compose_stack(
    tmp_path: Path, gt_env: dict[str, str]
) -> None:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords, runtimes_compose_env()) as running:
        assert isinstance(running, ComposeStack)
        stack = running
        # Each at its pinned version, runnable by the user the witness starts agents as (a home of its own: Gemini CLI
        # and OpenCode write theirs even for --version).
        for cli in RUNTIMES:
            shown = stack.exec("witness", "sh", "-c", f"HOME=$(mktemp -d) {cli.name} --version", user="agent")
            assert cli.pinned() in shown, (cli.name, shown)
        absent = stack.exec("witness", "sh", "-c", "command -v npm || echo none")
        assert absent.strip() == "none", "npm was used for the install only"

        with model_server_where_agents_run(stack, [worked_story(cli) for cli in RUNTIMES], tmp_path) as model_log:
            origin = stack.make_origin()
            assert origin == ORIGIN_ON_VOLUME
            gt = Operator(stack, gt_env, tmp_path / "operator", timeout=180, GT_HELPER="0")
            beads = {}
            for cli in RUNTIMES:
                gt("rig", "add", cli.name, origin, "--agent", cli.name, "--test", "test ! -e FAIL_TESTS")
                beads[cli.name] = gt("bead", "create", f"The {cli.name} feature [model-script:{cli.name}-compose]")
                gt("sling", beads[cli.name], cli.name)

            def all_closed() -> bool:
                for name, bead in beads.items():
                    status = json.loads(gt("bead", "show", bead, "--json"))["status"]
                    assert status == "closed", f"{name}'s {bead} is {status}"
                return True

            try:
                wait_until(all_closed, timeout=900, interval=3)
            except AssertionError as exc:
                tails = "\n".join(f"--- {name}\n{stack.log_tail(name, 80)}" for name in ("witness", "refinery"))
                sessions = gt("session", "list", "--all")
                raise AssertionError(f"{exc}\n{sessions}\n{tails}\n--- model server\n{model_log()[-6000:]}") from None
            failures = [line for line in model_log().splitlines() if "model_server_script_failure" in line]
            assert failures == [], failures

        merged = stack.origin_files(origin, "main")
        for cli in RUNTIMES:
            assert merged.count(feature(cli)) == 1, (cli.name, merged)
            shown = stack.exec("witness", "git", "--git-dir", origin, "show", f"main:{feature(cli)}")
            assert shown == f"written by {cli.name}\n", (cli.name, shown)

        def each_worked_by_one_session_of_its_runtime() -> bool:
            sessions = json.loads(gt("session", "list", "--all", "--json"))
            for cli in RUNTIMES:
                of_bead = [s for s in sessions if s["bead"] == beads[cli.name]]
                assert [(s["agent"], s["end_reason"]) for s in of_bead] == [(cli.name, "done")], of_bead
            return True

        wait_until(each_worked_by_one_session_of_its_runtime, timeout=120, interval=2)
