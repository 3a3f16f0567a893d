"""OpenCode (``opencode-ai``) as a runtime: interactive in its pane with the beacon as its first prompt. Pure (the
plugin's source, ``opencode_plugin.js`` beside this module, is read once at import, as package data).

Facts (../shared/research/runtimes.md, measured with 1.18.33; anomalyco/opencode packages/web/src/content/docs
config.mdx, plugins.mdx): its config is ``$OPENCODE_CONFIG`` (written per session), its state under the session's
``XDG_*`` directories. A provider of our own (``@ai-sdk/openai-compatible``, bundled: Chat Completions) takes its
``baseURL`` and key from ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (``{env:...}`` in the config: the key is never
written to a file). Every permission is ``allow`` (the polecat's containment is the town's), auto-update, sharing,
model-list fetches and LSP downloads are off: it shows no dialog.

Hooks are a plugin (``plugins/gastown.js`` in its config dir): OpenCode npm-installs its plugin package into every
config dir it loads plugins from unless ``node_modules`` is there and ``package-lock.json`` lists the package
(offline, that install hangs its start), so both are written too; the plugin imports nothing of it. The plugin runs
``gt agent-hook --runtime opencode`` on the session's start (``gt prime`` added to the system prompt), its idle
(turn done: a reason to go on is sent as the next prompt) and its errors (turn failed), marks activity after every
tool call and retry, and appends each answer's usage to ``opencode-usage.jsonl``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from importlib import resources
from typing import Any, ClassVar

from shared.core.runtime_dir import HOOK_MARK_SESSION_START, SESSION_DIR_ENV
from shared.model.runtimes.base import (
    HOOK_MARGIN_S,
    HOOK_MARK_ACTIVITY,
    SESSION_TOWN_PATIENCE_S,
    NudgeTyping,
    RuntimeFile,
    TuiRuntime,
    UsageReader,
)
from shared.model.usage import OpenCodeUsage

OPENCODE = "opencode"
HOME_DIR = "home"
CONFIG = "opencode.json"
"""Its config (``OPENCODE_CONFIG``), in the session's runtime dir."""
CONFIG_DIR = f"{HOME_DIR}/.config/opencode"
"""Its global config dir (``$XDG_CONFIG_HOME/opencode``): plugins, and what stops its npm install."""
USAGE_FILE = "opencode-usage.jsonl"
"""Each assistant message's usage as the plugin saw it (``{"id", "model", "provider", "tokens"}``), one line per
update: the newest line of an id wins."""
PLUGIN_PACKAGE = "@opencode-ai/plugin"
OPENCODE_PASSTHROUGH = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY")
OPENCODE_KEY = "OPENAI_API_KEY"
OPENCODE_BASE_URL = "OPENAI_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
OPENCODE_MODEL_ENV = "GT_OPENCODE_MODEL"
DEFAULT_MODEL = "gpt-5.5"
CONTEXT_WINDOW = 200_000
OUTPUT_LIMIT = 32_000
OPENCODE_SWITCHES = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}
"""No update check, no fetch of the model list, no download of language servers or default plugins, no sharing:
nothing it does at start needs the network but its model."""
OPENCODE_BUSY = re.compile(r"esc interrupt")
"""Its footer while a turn runs (``■■■⬝⬝⬝⬝⬝  esc interrupt``)."""
OPENCODE_RETRY_SCREEN = re.compile(r"\[retrying (?:in [^\]]* )?attempt #\d+\]")
"""Its status while it waits out a refused request (``[retrying in 2s attempt #1]``)."""
OPENCODE_REFUSAL_SCREEN = re.compile(r"(?:Incorrect API key|invalid[_ ]api[_ ]key|Unauthorized)[^\n]*", re.IGNORECASE)
REFUSED_ERRORS = re.compile(r"ProviderAuthError|:40[13]$")
"""A turn-failure record's ``error`` (``<name>[:<HTTP status>]``, as the plugin writes it) of refused credentials."""
PLUGIN_SOURCE = resources.files(__package__).joinpath("opencode_plugin.js").read_text(encoding="utf-8")


class OpenCodeRuntime(TuiRuntime):
    """OpenCode in its TUI. It confirms its start (its plugin's session-start), its activity is the plugin's marks
    and usage lines, its usage the plugin's record of each answer."""

    name = OPENCODE
    activity_files: tuple[str, ...] = (HOOK_MARK_ACTIVITY, HOOK_MARK_SESSION_START, USAGE_FILE)
    usage_files: tuple[str, ...] = (USAGE_FILE,)
    context_window = CONTEXT_WINDOW
    busy_screen = OPENCODE_BUSY
    retry_screen = OPENCODE_RETRY_SCREEN
    refusal_screen = OPENCODE_REFUSAL_SCREEN
    binary_name: ClassVar[str] = "opencode"
    binary_setting: ClassVar[str] = "GT_OPENCODE_BIN"
    package: ClassVar[str] = "opencode-ai"
    wants_version: ClassVar[bool] = True  # the plugin package's version stops OpenCode's install

    def command(self, beacon: str, binary: str) -> str:
        return f"exec {shlex.quote(binary)} --prompt {shlex.quote(beacon)}"

    def unavailable(self, env: Mapping[str, str], *, logged_in: bool) -> str | None:
        if env.get(OPENCODE_KEY):
            return None
        return (
            f"no credentials for OpenCode: set {OPENCODE_KEY} in the witness's environment (and "
            f"{OPENCODE_BASE_URL} for another endpoint)"
        )

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        home = f"{session_dir}/{HOME_DIR}"
        env = {
            "HOME": home,
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "OPENCODE_CONFIG": f"{session_dir}/{CONFIG}",
            SESSION_DIR_ENV: session_dir,
            **OPENCODE_SWITCHES,
        }
        env.update({name: value for name, value in witness_env.items() if name in OPENCODE_PASSTHROUGH})
        env.setdefault(OPENCODE_BASE_URL, DEFAULT_BASE_URL)
        return env

    def config(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The session's ``opencode.json``: our provider and model, every permission granted, nothing shared."""
        model = env.get(OPENCODE_MODEL_ENV, "").strip() or DEFAULT_MODEL
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "gastown",
            "options": {"baseURL": f"{{env:{OPENCODE_BASE_URL}}}", "apiKey": f"{{env:{OPENCODE_KEY}}}"},
            "models": {
                model: {"name": model, "tool_call": True, "limit": {"context": CONTEXT_WINDOW, "output": OUTPUT_LIMIT}}
            },
        }
        return {
            "$schema": "https://opencode.ai/config.json",
            "model": f"gastown/{model}",
            "small_model": f"gastown/{model}",
            "autoupdate": False,
            "share": "disabled",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow", "external_directory": "allow"},
            "provider": {"gastown": provider},
        }

    def plugin(self, gt: str) -> str:
        """The plugin's source with the session's values in it."""
        values = {
            "__GT__": json.dumps(gt),
            "__HOOK_TIMEOUT_MS__": str(int((SESSION_TOWN_PATIENCE_S + HOOK_MARGIN_S) * 1000)),
            "__ACTIVITY__": HOOK_MARK_ACTIVITY,
            "__USAGE__": USAGE_FILE,
        }
        source = PLUGIN_SOURCE
        for name, value in values.items():
            source = source.replace(name, value)
        return source

    def files(self, *, worktree: str, env: Mapping[str, str], version: str, gt: str) -> tuple[RuntimeFile, ...]:
        lock = {
            "name": "gastown-session",
            "lockfileVersion": 3,
            "requires": True,
            "packages": {"": {"dependencies": {PLUGIN_PACKAGE: version or "*"}}},
        }
        return (
            RuntimeFile(path=CONFIG, content=json.dumps(self.config(env), indent=2) + "\n"),
            RuntimeFile(path=f"{CONFIG_DIR}/plugins/gastown.js", content=self.plugin(gt)),
            RuntimeFile(path=f"{CONFIG_DIR}/package-lock.json", content=json.dumps(lock, indent=2) + "\n"),
            RuntimeFile(path=f"{CONFIG_DIR}/node_modules/.gastown", content="OpenCode's install is not needed.\n"),
        )

    def usage_reader(self) -> UsageReader:
        return OpenCodeUsage()

    def refusal(self, failure: Mapping[str, Any] | None, screen: str = "") -> str | None:
        error = str((failure or {}).get("error") or "")
        if REFUSED_ERRORS.search(error):
            details = " ".join(str((failure or {}).get("details") or error).split())[:300]
            return f"the model API refused its credentials ({details})"
        return None

    def nudge(self, message: str) -> NudgeTyping:
        """Typed as a prompt once it is idle (typed while a turn runs, it would be sent as soon as typed)."""
        return NudgeTyping(text=message, when_busy=False)
