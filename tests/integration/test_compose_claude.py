"""The witness image runs the real Claude Code: the stack built with ``GT_CLAUDE_CODE_VERSION`` (the pinned
version, ops/claude-code.version), a rig with ``--agent claude``, and the scripted model server in the witness's
container (``python -m gt.model_server``, the Anthropic Messages API on its loopback). Claude Code's session,
started by the witness in its container, acts out the demo's story (``gt prime``, a guide written and edited
with its own tools, committed, every step done, ``gt done``), and the refinery merges it into the rig's
repository on the gt-home volume. Needs the stack in containers, as test_compose_lifecycle.py does."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.compose_stack import USERS, ComposeStack, Operator, podman_compose_ready, running_stack
from tests.conftest import REPO_ROOT
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(
    not podman_compose_ready(), reason="the stack in containers needs rootful podman (./dev test sets it up as root)"
)

MODEL_PORT = 18790
"""The model server's port on the witness container's loopback (Claude Code's sessions run in that container)."""
RIG = "docs"
WORKTREE = f"/var/lib/gastown/rigs/{RIG}/polecats/ace"
"""The first polecat's worktree in the rig (the story's Write and Edit take absolute paths)."""


@pytest.mark.compose_stack
@pytest.mark.timeout(1500)
def test_a_claude_code_polecat_in_the_witness_container_gets_its_work_merged(
    tmp_path: Path, gt_env: dict[str, str]
) -> None:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    compose_env = {
        "GT_CLAUDE_CODE_VERSION": (REPO_ROOT / "ops" / "claude-code.version").read_text().strip(),
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}",
        "ANTHROPIC_API_KEY": "sk-ant-scripted-model-server-not-a-real-key-0123456789",  # the server takes any
        "ANTHROPIC_MODEL": "claude-scripted-demo",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords, compose_env) as running:
        assert isinstance(running, ComposeStack)
        stack = running
        version = stack.exec("witness", "claude", "--version")
        assert compose_env["GT_CLAUDE_CODE_VERSION"] in version, version

        scripts = stack.exec("witness", "python", "-m", "gt.model_server.demo_story", WORKTREE)
        stack.exec("witness", "sh", "-c", "cat > /tmp/model-scripts.json", stdin=scripts)
        stack.exec(
            "witness", "python", "-m", "gt.model_server", "/tmp/model-scripts.json", "--port", str(MODEL_PORT),
            detach=True,
        )  # fmt: skip
        probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{MODEL_PORT}/', timeout=2)"

        def serving() -> bool:
            run = subprocess.run(
                ["podman", "exec", stack.container("witness"), "python", "-c", probe],
                capture_output=True,
                text=True,
                check=False,
            )
            return run.returncode == 0 or "HTTPError" in run.stderr  # any HTTP answer: it listens

        wait_until(serving, timeout=60, interval=0.5, message="the model server does not answer")

        origin = stack.make_origin()
        gt = Operator(stack, gt_env, tmp_path / "operator", timeout=180, GT_HELPER="0")

        gt("rig", "add", RIG, origin, "--agent", "claude", "--test", "test ! -e FAIL_TESTS", "--stall-after", "3600")
        bead = gt("bead", "create", "Document the frobulator", "-t", "docs")
        gt("sling", bead, RIG)

        def closed() -> bool:
            status = json.loads(gt("bead", "show", bead, "--json"))["status"]
            assert status == "closed", f"{bead} is {status}"
            return True

        try:
            wait_until(closed, timeout=600, interval=2)
        except AssertionError as exc:
            tails = "\n".join(f"--- {name}\n{stack.log_tail(name, 60)}" for name in ("witness", "refinery"))
            raise AssertionError(f"{exc}\n{tails}") from None
        assert "USAGE.md" in stack.origin_files(origin, "main")
        guide = stack.exec("witness", "git", "--git-dir", origin, "show", "main:USAGE.md")
        assert "Run `frobulate --help` for its options." in guide, guide  # written, then edited by Claude Code
