"""``./dev demo``'s script, run as a user runs it: it exits 0 having shown a gt-agent polecat crash and recover and
a Claude Code polecat, driven by the scripted model server, merge a real change; no vendor API is called (the
model server is the only model)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_runtimes import CODEX
from tests.claude_code import REPO, claude_binary

DEMO_TIMEOUT_S = 200.0  # under pytest-timeout's 300 s, so the demo is stopped by its own trap


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``ops/demo.sh`` to its end. Past the deadline it is sent SIGTERM, so its exit trap stops the town and the
    model server, then whatever is left of its process group is killed."""
    demo = subprocess.Popen(
        ["ops/demo.sh"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = demo.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        demo.terminate()
        try:
            out, err = demo.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
        raise AssertionError(f"the demo ran past {DEMO_TIMEOUT_S} s:\n{out[-6000:]}\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(demo.args, demo.returncode, out, err)


@pytest.fixture
def demo_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The demo's environment as a user's, with its temporary files and its tmux server's socket where the test
    sees them (TMPDIR, TMUX_TMPDIR: a short path, as a socket's must be)."""
    tmux_dir = Path(tempfile.mkdtemp(prefix="gtd-"))
    (tmp_path / "tmp").mkdir()
    try:
        yield {
            **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "GT_", "TMUX"))},
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TMPDIR": str(tmp_path / "tmp"),
            "TMUX_TMPDIR": str(tmux_dir),
            "GT_TMUX_SOCKET": f"gt-test-demo-{uuid.uuid4().hex[:8]}",
        }
    finally:
        shutil.rmtree(tmux_dir, ignore_errors=True)


def left_behind(env: dict[str, str]) -> list[Path]:
    """What of the demo is still there: its directory (GT_HOME, the model server's files), its tmux socket."""
    sockets = Path(env["TMUX_TMPDIR"]).glob(f"tmux-*/{env['GT_TMUX_SOCKET']}")
    return [*Path(env["TMPDIR"]).glob("gastown-demo-*"), *sockets]


def test_the_demo_shows_claude_code_and_codex_polecats_side_by_side_beside_gt_agent(demo_env: dict[str, str]) -> None:
    claude_binary()  # fails (never skips) naming ./dev setup when the pinned Claude Code is missing
    CODEX.binary()  # and Codex CLI
    env = demo_env
    done = run_demo(env)
    out = done.stdout
    assert done.returncode == 0, f"the demo exited {done.returncode}:\n{out[-6000:]}\n{done.stderr[-4000:]}"
    assert "serving at http://127.0.0.1:" in out, "the scripted model server, on loopback"
    assert "--agent claude" in out
    claude_part = out[out.index("Claude Code's session") : out.index("Codex CLI's session")]
    assert "ended (done)" in claude_part, "one Claude Code session, done"
    assert "6/6  complete" in claude_part, "every step of its molecule done"
    assert "Run `frobulate --help` for its options." in claude_part, "its Write then Edit, merged to main"
    assert "the last lines of its tmux pane" in claude_part
    assert "bypass permissions on" in claude_part, "the pane shows Claude Code's own screen"
    assert "The user guide is in the merge queue. Done." in claude_part, "the model's last words, on screen"
    codex_part = out[out.index("Codex CLI's session") :]
    assert "--agent codex" in out
    assert "ended (done)" in codex_part, "one Codex CLI session, done"
    assert "- The frobulator frobulates." in codex_part, "its changelog, merged to main"
    codex_session = re.search(r"(hq-[0-9a-z]+-\d+)\s+docs/\w+\s+hq-[0-9a-z]+\s+ended \(done\)", codex_part)
    assert codex_session is not None, codex_part[:2000]
    costs = codex_part[codex_part.index("gt costs") :]
    used = re.search(rf"^{codex_session.group(1)}\s+([0-9]+)\s+([0-9]+)", costs, re.MULTILINE)
    assert used is not None, costs[:1000]
    assert int(used.group(1)) > 0, "its usage, read from its rollouts, in gt costs"
    assert int(used.group(2)) > 0
    assert "strayed from the model's script" not in done.stdout + done.stderr
    assert "a fresh one resumed at step 3" in out, "gt-agent's part is still there"
    assert left_behind(env) == [], "the demo cleans up after itself"


def test_a_demo_that_fails_cleans_up_too_and_shows_its_logs(demo_env: dict[str, str]) -> None:
    env = {**demo_env, "GT_UMASK": "not-a-mode"}  # `gt up` refuses to start
    done = run_demo(env)
    assert done.returncode != 0, done.stdout
    assert "GT_UMASK" in done.stderr, done.stderr
    assert left_behind(env) == [], "cleaned up on failure too"
