"""Gemini CLI (``@google/gemini-cli``) as a runtime: interactive in its pane with the beacon as its first prompt.
Pure.

Facts (../shared/research/runtimes.md, measured with 0.61; google-gemini/gemini-cli docs/reference/configuration.md
and docs/hooks): its settings are ``$GEMINI_CLI_HOME/.gemini/settings.json``, written per session. The API key
method is chosen (``security.auth.selectedType``; else it asks how to authenticate), folder trust is off (else "Do
you trust the files in this folder?" and ``--yolo`` downgraded), updates, telemetry and usage statistics are off.
It reads ``GEMINI_API_KEY`` and ``GOOGLE_GEMINI_BASE_URL`` itself. Instructions: GEMINI.md, and AGENTS.md once
``context.fileName`` names it. Its shell tool refuses a command holding ``$(...)`` or backticks, even in YOLO mode.
It survives the SIGHUP of a closed pane: the pane's reaper ends it with SIGTERM (``shared.host.reaper``).

Hooks (user-level in settings.json: they run without a trust prompt; each prints JSON or nothing): SessionStart
runs ``gt agent-hook --runtime gemini session-start`` (its mark; ``gt prime`` as ``additionalContext``), AfterAgent
``gt agent-hook --runtime gemini stop`` (``{"decision": "block", "reason"}`` starts another turn with the reason
as its prompt while steps are open), AfterTool marks activity.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from shared.core.runtime_dir import HOOK_MARK_SESSION_START, SESSION_DIR_ENV
from shared.model.runtimes.base import (
    ACTIVITY_HOOK,
    HOOK_MARGIN_S,
    HOOK_MARK_ACTIVITY,
    SESSION_TOWN_PATIENCE_S,
    NudgeTyping,
    RuntimeFile,
    TuiRuntime,
    UsageReader,
)
from shared.model.usage import GeminiChats

GEMINI = "gemini"
HOME_DIR = "home"
SETTINGS = f"{HOME_DIR}/.gemini/settings.json"
GEMINI_CHATS = f"{HOME_DIR}/.gemini/tmp/*/chats/*.jsonl"
"""Its chat records, one file per session, appended to with every message."""
GEMINI_PASSTHROUGH = (
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
    "GEMINI_MODEL",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
)
GEMINI_CREDENTIALS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
GEMINI_CONTEXT_WINDOW = 1_048_576
"""Gemini 2.5's and 3's input limit (its chat records say nothing of it)."""
GEMINI_COMPRESSION_AT = 0.9
"""The share of its context at which it compresses its history (its default, 0.5, comes before the witness tells
the session to hand off: ``GT_CONTEXT_HANDOFF``, 0.6 and 0.8)."""
GEMINI_BUSY = re.compile(r"esc to cancel")
"""Its loading line while a turn runs (``(esc to cancel, 12s)``)."""
GEMINI_RETRY_SCREEN = re.compile(
    r"This is taking a bit longer, we're still on it\.|Trying to reach [^\n]*\(Attempt \d+/\d+\)"
)
GEMINI_REFUSAL_SCREEN = re.compile(r"\[API Error: [^\n]*(?:UNAUTHENTICATED|401|API key not valid)[^\n]*")
GEMINI_BLOCKING_SCREENS = (
    ("its sign-in question", re.compile(r"How would you like to authenticate")),
    ("its folder trust dialog", re.compile(r"Do you trust the files in this folder|Trust folder")),
    ("an update prompt", re.compile(r"update (?:is )?available[^\n]*\n[\s\S]*(?:Yes|No)", re.IGNORECASE)),
)
ACTIVITY_HOOK_JSON = f"{ACTIVITY_HOOK}; echo '{{}}'"
"""Its AfterTool hook: the activity mark, and the empty JSON answer it reads."""


class GeminiRuntime(TuiRuntime):
    """Gemini CLI in its TUI (``--yolo``: every tool call approved)."""

    name = GEMINI
    activity_files: tuple[str, ...] = (HOOK_MARK_ACTIVITY, HOOK_MARK_SESSION_START, GEMINI_CHATS)
    usage_files: tuple[str, ...] = (GEMINI_CHATS,)
    context_window = GEMINI_CONTEXT_WINDOW
    busy_screen = GEMINI_BUSY
    retry_screen = GEMINI_RETRY_SCREEN
    refusal_screen = GEMINI_REFUSAL_SCREEN
    blocking_screens = GEMINI_BLOCKING_SCREENS
    nothing_to_say = "{}"  # its hooks must print JSON
    binary_name: ClassVar[str] = "gemini"
    binary_setting: ClassVar[str] = "GT_GEMINI_BIN"
    package: ClassVar[str] = "@google/gemini-cli"

    def command(self, beacon: str, binary: str) -> str:
        return f"exec {shlex.quote(binary)} --yolo {shlex.quote(beacon)}"

    def unavailable(self, env: Mapping[str, str], *, logged_in: bool) -> str | None:
        if any(env.get(name) for name in GEMINI_CREDENTIALS):
            return None
        return (
            f"no credentials for Gemini CLI: set {' or '.join(GEMINI_CREDENTIALS)} in the witness's environment "
            "(and GOOGLE_GEMINI_BASE_URL for another endpoint)"
        )

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        home = f"{session_dir}/{HOME_DIR}"
        env = {"HOME": home, "GEMINI_CLI_HOME": home, SESSION_DIR_ENV: session_dir}
        env.update({name: value for name, value in witness_env.items() if name in GEMINI_PASSTHROUGH})
        return env

    def settings(self, gt: str) -> dict[str, Any]:
        gt_q = shlex.quote(gt)

        def hook(command: str, timeout_s: float) -> list[dict[str, Any]]:
            return [
                {"matcher": "*", "hooks": [{"type": "command", "command": command, "timeout": int(timeout_s * 1000)}]}
            ]

        return {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "ide": {"enabled": False},
            "ui": {"hideBanner": True, "hideTips": True},
            "context": {"fileName": ["AGENTS.md", "GEMINI.md"]},
            "model": {"compressionThreshold": GEMINI_COMPRESSION_AT},
            "hooks": {
                "SessionStart": hook(f"{gt_q} agent-hook --runtime gemini session-start", 120),
                "AfterAgent": hook(f"{gt_q} agent-hook --runtime gemini stop", SESSION_TOWN_PATIENCE_S + HOOK_MARGIN_S),
                "AfterTool": hook(ACTIVITY_HOOK_JSON, 10),
            },
        }

    def files(self, *, worktree: str, env: Mapping[str, str], version: str, gt: str) -> tuple[RuntimeFile, ...]:
        return (RuntimeFile(path=SETTINGS, content=json.dumps(self.settings(gt), indent=2) + "\n"),)

    def usage_reader(self) -> UsageReader:
        return GeminiChats()

    def nudge(self, message: str) -> NudgeTyping:
        """Typed as a prompt, even while a turn runs: it queues what is typed then and sends it when idle."""
        return NudgeTyping(text=message, when_busy=True)
