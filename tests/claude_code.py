"""The real Claude Code CLI for tests: where ``./dev setup`` installed it, and a config home it starts in without
a single first-run dialog, pointed at a scripted model server.

Settings used (Claude Code's docs, search tool docs corpus: code.claude.com/docs/en/env-vars and /en/settings):
``ANTHROPIC_BASE_URL`` (the API endpoint), ``ANTHROPIC_API_KEY`` (sent as ``x-api-key``),
``ANTHROPIC_CUSTOM_HEADERS`` ("Name: Value" lines added to every request: names the session's script),
``CLAUDE_CONFIG_DIR`` (where ``.claude.json`` and settings live instead of ``~/.claude``),
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` (no telemetry, error reporting, auto-update checks),
``DISABLE_AUTOUPDATER``, ``DISABLE_TELEMETRY``, ``DISABLE_ERROR_REPORTING``; ``IS_SANDBOX=1`` lets
``--dangerously-skip-permissions`` run as root (it refuses root otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gt.model_server import ModelServer
from services.witness.state import UsageMark
from shared.model.usage import TOKEN_FIELDS

REPO = Path(__file__).resolve().parent.parent
VERSION_FILE = REPO / "ops" / "claude-code.version"
LOCAL_BINARY = REPO / ".tools" / "npm" / "node_modules" / ".bin" / "claude"
TEST_KEY = "sk-ant-api03-scripted-model-server-test-key-0123456789abcdefghij"


def pinned_version() -> str:
    """The Claude Code version ``./dev setup`` installs (ops/claude-code.version)."""
    return VERSION_FILE.read_text().strip()


def claude_binary() -> Path:
    """The pinned ``claude`` (``GT_CLAUDE_BIN``, else the project-local npm prefix, else ``PATH``).

    Fails (never skips) when it is missing or not the pinned version: ``./dev setup`` installs it."""
    configured = os.environ.get("GT_CLAUDE_BIN")
    found = configured or (str(LOCAL_BINARY) if LOCAL_BINARY.exists() else shutil.which("claude"))
    if not found:
        raise AssertionError("claude is not installed: run ./dev setup (it installs the pinned Claude Code with npm)")
    reported = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    if pinned_version() not in reported:
        raise AssertionError(f"{found} is {reported.strip()!r}, not the pinned {pinned_version()}: run ./dev setup")
    return Path(found)


def first_run_state(projects: list[Path], key: str) -> dict[str, object]:
    """The ``.claude.json`` that answers every first-run screen before it is shown: onboarding done, the custom
    API key approved (its last 20 characters), each project's folder trusted, bypass-permissions accepted."""
    return {
        "hasCompletedOnboarding": True,
        "lastOnboardingVersion": pinned_version(),
        "bypassPermissionsModeAccepted": True,
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {
            str(project): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True, "allowedTools": []}
            for project in projects
        },
    }


def claude_home(root: Path, projects: list[Path], *, key: str = TEST_KEY) -> Path:
    """A HOME of its own (git identity included) whose ``.claude`` config dir holds the first-run state."""
    home = root / "home"
    config = home / ".claude"
    config.mkdir(parents=True, exist_ok=True)
    state = json.dumps(first_run_state(projects, key), indent=2)
    (config / ".claude.json").write_text(state)
    (home / ".claude.json").write_text(state)
    (home / ".gitconfig").write_text("[user]\n\tname = Scripted Polecat\n\temail = polecat@example.invalid\n")
    return home


def claude_env(
    home: Path, base_url: str, *, script: str, key: str = TEST_KEY, nonessential_traffic: bool = False
) -> dict[str, str]:
    """The environment ``claude`` runs in: only what it needs, nothing of the operator's own.

    ``nonessential_traffic``: leave Claude Code's non-essential requests on, as an operator's default is: a
    connectivity check (``HEAD /api/hello``) and session-title requests to a small model reach the model server.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        "IS_SANDBOX": "1",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_CUSTOM_HEADERS": f"x-gt-model-script: {script}",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    if nonessential_traffic:
        del env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
    return env


@pytest.fixture
def claude_witness_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The witness's environment as an operator's would be: Claude Code's settings, no GT_AGENT_ENV."""
    monkeypatch.setenv("GT_CLAUDE_BIN", str(claude_binary()))
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEST_KEY)
    for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY"):
        monkeypatch.setenv(name, "1")
    monkeypatch.delenv("GT_AGENT_ENV", raising=False)
    monkeypatch.delenv("ANTHROPIC_CUSTOM_HEADERS", raising=False)


def usage_sent(server: ModelServer, script: str) -> dict[str, int]:
    """What the model server told a script's session it used: the sum of its answers' usage blocks."""
    return {name: sum(block[name] for block in server.usage(script)) for name in TOKEN_FIELDS}


def usage_recorded(mark: UsageMark, model: str) -> dict[str, int]:
    """What the witness recorded for a session (its ``session.usage`` totals), all of it for ``model``."""
    assert [m.model for m in mark.models] == [model], mark.models
    return {name: getattr(mark.models[0], name) for name in TOKEN_FIELDS}
