"""Codex CLI (``@openai/codex``) as a runtime: interactive in its pane with the beacon as its first prompt. Pure.

Facts (../shared/research/runtimes.md, measured with 0.169 and 0.171; its config reference,
developers.openai.com/codex/config-reference and /codex/hooks): everything is in ``$CODEX_HOME/config.toml``,
written per session. A provider of our own (``model_provider``) whose key comes from ``OPENAI_API_KEY`` needs no
login screen; its ``base_url`` is ``OPENAI_BASE_URL`` (the vendor's conventional variable, written into the file:
a custom provider does not read it). ``approval_policy = "never"`` with ``sandbox_mode = "danger-full-access"``
runs every command without asking (the polecat's containment is the town's: its own OS user, its NATS identity).
The worktree is trusted (``[projects."<path>"]``: else "Trust this folder?"), the model-migration notice answered,
update checks and analytics off, ``allow_login_shell = false`` (a login shell resets PATH and loses ``gt``). The TUI
starts an app-server daemon that outlives the pane unless ``--no-daemon``.

Hooks (inline in config.toml; run without persisted trust only with ``--dangerously-bypass-hook-trust``, the witness
having written them): SessionStart runs ``gt agent-hook --runtime codex session-start`` (its mark for the
witness; ``gt prime`` as ``additionalContext``), Stop runs ``gt agent-hook --runtime codex stop`` (its
``{"decision": "block", "reason"}`` makes the reason Codex's next prompt while steps are open), PostToolUse marks
activity. A hook's stdout must be empty or JSON.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from shared.core.runtime_dir import HOOK_MARK_SESSION_START, SESSION_DIR_ENV
from shared.model import transcripts
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
from shared.model.usage import CodexRollouts

CODEX = "codex"
HOME_DIR = "home"
CODEX_HOME = f"{HOME_DIR}/.codex"
"""Its ``CODEX_HOME``, in the session's runtime dir."""
CODEX_ROLLOUTS = f"{CODEX_HOME}/sessions/*/*/*/rollout-*.jsonl"
"""Its rollouts, one per thread, appended to with every event (``sessions/YYYY/MM/DD/``)."""
CODEX_PASSTHROUGH = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "SSL_CERT_FILE")
"""What a session takes from the witness's environment when set, without ``GT_AGENT_ENV``."""
CODEX_KEY = "OPENAI_API_KEY"
CODEX_BASE_URL = "OPENAI_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
CODEX_MODEL_ENV = "GT_CODEX_MODEL"
DEFAULT_MODEL = "gpt-5.5"
"""A model Codex 0.171 knows (``codex debug models --bundled``): an unknown one works, with a warning on screen."""
MIGRATION_NOTICES = {"gpt-5.5": "gpt-6-sol"}
"""Model-migration dialects already answered ("Meet GPT-6 Sol" blocks the TUI for gpt-5.5 otherwise)."""
CODEX_LOGIN_DIR_ENV = "GT_CODEX_HOME"
"""A logged-in Codex home (``codex login`` ran with it): its ``auth.json`` is copied into each session's."""
STREAM_MAX_RETRIES = 5
CODEX_BUSY = re.compile(r"esc to interrupt\)")
"""Its status line while a turn runs (``• Working (12s • esc to interrupt)``)."""
CODEX_RETRY_SCREEN = re.compile(r"Reconnecting\.\.\. \d+/\d+")
"""Its status while it retries a refused or dropped request (``Reconnecting... 2/5``)."""
CODEX_REFUSAL_SCREEN = re.compile(r"unexpected status 401 Unauthorized[^\n]*")
CODEX_BLOCKING_SCREENS = (
    ("its folder trust dialog", re.compile(r"Do you trust the contents of this directory|Trust this folder")),
    ("its hooks review", re.compile(r"Hooks need review|hooks? need review before")),
    ("its sign-in screen", re.compile(r"Sign in with ChatGPT|Provide your own API key")),
    ("a model notice", re.compile(r"Meet GPT|Try new model|Choose a model")),
    ("an update prompt", re.compile(r"Update available!?[^\n]*\n[\s\S]*Skip")),
)


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml(value: Any) -> str:
    """A TOML value: strings as basic strings (JSON's escapes are TOML's), lists inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(str(value))


def _key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else _toml(key)


def _table(name: str, values: Mapping[str, Any], *, array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    return "\n".join([head, *(f"{_key(key)} = {_toml(value)}" for key, value in values.items())])


class CodexRuntime(TuiRuntime):
    """Codex CLI in its TUI. It confirms its start (SessionStart hook), its activity is its hooks' marks and its
    rollouts, its usage the rollouts' ``token_count`` events."""

    name = CODEX
    activity_files: tuple[str, ...] = (HOOK_MARK_ACTIVITY, HOOK_MARK_SESSION_START, CODEX_ROLLOUTS)
    usage_files: tuple[str, ...] = (CODEX_ROLLOUTS,)
    transcript_files: tuple[str, ...] = (CODEX_ROLLOUTS,)
    # Its context window is in its rollouts (``model_context_window``), none assumed here.
    busy_screen = CODEX_BUSY
    retry_screen = CODEX_RETRY_SCREEN
    refusal_screen = CODEX_REFUSAL_SCREEN
    blocking_screens = CODEX_BLOCKING_SCREENS
    binary_name: ClassVar[str] = "codex"
    binary_setting: ClassVar[str] = "GT_CODEX_BIN"
    package: ClassVar[str] = "@openai/codex"

    def command(self, beacon: str, binary: str) -> str:
        return f"exec {shlex.quote(binary)} --no-daemon --dangerously-bypass-hook-trust {shlex.quote(beacon)}"

    def unavailable(self, env: Mapping[str, str], *, logged_in: bool) -> str | None:
        if env.get(CODEX_KEY) or logged_in:
            return None
        return (
            f"no credentials for Codex CLI: set {CODEX_KEY} in the witness's environment (and {CODEX_BASE_URL} for "
            f"another endpoint), or {CODEX_LOGIN_DIR_ENV} to a Codex home where `codex login` was done"
        )

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        env = {"HOME": f"{session_dir}/{HOME_DIR}", "CODEX_HOME": f"{session_dir}/{CODEX_HOME}"}
        env[SESSION_DIR_ENV] = session_dir
        env.update({name: value for name, value in witness_env.items() if name in CODEX_PASSTHROUGH})
        return env

    def config(self, worktree: str, env: Mapping[str, str], gt: str) -> str:
        """The session's ``config.toml``: no dialog, no update check, our provider, the worktree trusted, hooks."""
        model = env.get(CODEX_MODEL_ENV, "").strip() or DEFAULT_MODEL
        own_key = bool(env.get(CODEX_KEY))
        top: dict[str, Any] = {
            "model": model,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            "allow_login_shell": False,
        }
        if own_key:
            top["model_provider"] = "gastown"
        gt_q = shlex.quote(gt)

        def hook(event: str, command: str, timeout: int) -> str:
            handler = {"type": "command", "command": command, "timeout": timeout}
            return f"[[hooks.{event}]]\n" + _table(f"hooks.{event}.hooks", handler, array=True)

        tables = [
            "\n".join(f"{key} = {_toml(value)}" for key, value in top.items()),
            _table("analytics", {"enabled": False}),
            # Its shell snapshots write the session's environment (its model key) to files in its config home.
            _table("features", {"shell_snapshot": False}),
            _table("tui", {"screen_reader_detection_done": True, "terminal_title": ["run-state", "project-name"]}),
            _table("notice.model_migrations", MIGRATION_NOTICES),
            _table(f"projects.{_toml(worktree)}", {"trust_level": "trusted"}),
            hook("SessionStart", f"{gt_q} agent-hook --runtime codex session-start", 120),
            hook("Stop", f"{gt_q} agent-hook --runtime codex stop", int(SESSION_TOWN_PATIENCE_S) + HOOK_MARGIN_S),
            hook("PostToolUse", ACTIVITY_HOOK, 10),
        ]
        if own_key:
            provider = {
                "name": "gastown",
                "base_url": env.get(CODEX_BASE_URL, "").strip() or DEFAULT_BASE_URL,
                "env_key": CODEX_KEY,
                "wire_api": "responses",
                "stream_max_retries": STREAM_MAX_RETRIES,
            }
            tables.append(_table("model_providers.gastown", provider))
        return "\n\n".join(tables) + "\n"

    def files(self, *, worktree: str, env: Mapping[str, str], version: str, gt: str) -> tuple[RuntimeFile, ...]:
        return (RuntimeFile(path=f"{CODEX_HOME}/config.toml", content=self.config(worktree, env, gt)),)

    def login_files(self, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        home = env.get(CODEX_LOGIN_DIR_ENV, "").strip()
        return ((f"{home.rstrip('/')}/auth.json", f"{CODEX_HOME}/auth.json"),) if home else ()

    def usage_reader(self) -> UsageReader:
        return CodexRollouts()

    def transcript_entries(self, record: dict[str, Any]) -> list[str]:
        return transcripts.codex_entries(record)

    def turn_mark(self, record: dict[str, Any]) -> tuple[str, str] | None:
        return transcripts.codex_mark(record)

    def nudge(self, message: str) -> NudgeTyping:
        """Typed as a prompt: while a turn runs, Tab queues it for the turn's end (Enter would steer the turn)."""
        return NudgeTyping(text=message, when_busy=False)
