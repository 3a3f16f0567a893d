"""OpenCode's runtime, its pure parts: the config and plugin written for a session, its environment, what its
screen and turn-failure record say, and its usage as the plugin records it. (Its behaviour with the real binary is
the conformance suite's: tests/integration/test_runtime_conformance.py.)"""

from __future__ import annotations

import json
import re

from shared.model.runtimes import HOOK_MARK_ACTIVITY, OPENCODE, OpenCodeRuntime, runtime_for
from shared.model.runtimes.opencode import CONFIG, CONFIG_DIR, USAGE_FILE
from shared.model.usage import ModelUsage, OpenCodeUsage

WITNESS_ENV = {"OPENAI_API_KEY": "sk-key", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "SECRET": "not passed"}


def test_opencode_is_named_by_its_runtime_name_and_starts_with_the_beacon_as_its_prompt() -> None:
    runtime = runtime_for(OPENCODE)
    assert isinstance(runtime, OpenCodeRuntime)
    assert runtime.command("go on; it's `x`", "/bin/opencode") == "exec /bin/opencode --prompt 'go on; it'\"'\"'s `x`'"
    assert runtime.confirms_start
    assert not runtime.pane_activity


def test_its_config_home_is_the_sessions_and_only_its_endpoint_variables_pass() -> None:
    env = OpenCodeRuntime().env(WITNESS_ENV, session_dir="/s", root=False)
    assert env["OPENCODE_CONFIG"] == f"/s/{CONFIG}"
    assert env["XDG_CONFIG_HOME"] == "/s/home/.config"
    assert env["HOME"] == "/s/home"
    assert all(env[name].startswith("/s/home/") for name in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"))
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert env["OPENAI_API_KEY"] == "sk-key"
    assert "SECRET" not in env
    assert env["OPENCODE_DISABLE_AUTOUPDATE"] == env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    # No endpoint given: the vendor's own, never an empty base URL in the config's {env:...}.
    bare = OpenCodeRuntime().env({"OPENAI_API_KEY": "k"}, session_dir="/s", root=False)
    assert bare["OPENAI_BASE_URL"] == "https://api.openai.com/v1"


def test_its_files_grant_every_tool_keep_the_key_out_and_stop_its_plugin_install() -> None:
    files = {f.path: f for f in OpenCodeRuntime().files(worktree="/w", env=WITNESS_ENV, version="1.18.33", gt="/v/gt")}
    config = json.loads(files[CONFIG].content)
    assert config["model"] == "gastown/gpt-5.5"
    assert set(config["permission"].values()) == {"allow"}
    provider = config["provider"]["gastown"]
    assert provider["options"] == {"baseURL": "{env:OPENAI_BASE_URL}", "apiKey": "{env:OPENAI_API_KEY}"}
    assert "sk-key" not in "".join(f.content for f in files.values()), "the key stays in the environment"
    lock = json.loads(files[f"{CONFIG_DIR}/package-lock.json"].content)
    assert lock["packages"][""]["dependencies"] == {"@opencode-ai/plugin": "1.18.33"}
    assert f"{CONFIG_DIR}/node_modules/.gastown" in files
    plugin = files[f"{CONFIG_DIR}/plugins/gastown.js"].content
    assert 'const GT = "/v/gt"' in plugin
    assert f'DIR + "/{HOOK_MARK_ACTIVITY}"' in plugin
    assert f'DIR + "/{USAGE_FILE}"' in plugin
    assert not re.search(r"__[A-Z_]+__", plugin), "every placeholder filled"
    assert re.findall(r'^import .* from "([^"]+)"', plugin, re.M) == ["node:child_process", "node:fs"]
    assert all(not f.in_worktree for f in files.values())
    model = OpenCodeRuntime().config({**WITNESS_ENV, "GT_OPENCODE_MODEL": "qwen3-coder"})
    assert model["model"] == "gastown/qwen3-coder"
    assert "qwen3-coder" in model["provider"]["gastown"]["models"]


def test_it_needs_a_key() -> None:
    assert OpenCodeRuntime().unavailable(WITNESS_ENV, logged_in=False) is None
    why = OpenCodeRuntime().unavailable({}, logged_in=False)
    assert why is not None
    assert "OPENAI_API_KEY" in why


def test_a_refused_key_is_read_from_its_turn_failure_record_and_nothing_else_is_a_refusal() -> None:
    runtime = OpenCodeRuntime()
    refused = runtime.refusal({"error": "APIError:401", "details": "Incorrect API key provided"})
    assert refused is not None
    assert "Incorrect API key provided" in refused
    assert runtime.refusal({"error": "ProviderAuthError", "details": ""}) is not None
    assert runtime.refusal({"error": "APIError:429", "details": "slow down"}) is None
    assert runtime.refusal({"error": "APIError:4010", "details": ""}) is None
    assert runtime.refusal(None) is None


def test_its_footer_says_busy_and_its_retries_are_activity() -> None:
    runtime = OpenCodeRuntime()
    busy = "  ┃  Build · gpt-5.5 gastown\n   ■■■⬝⬝⬝⬝⬝  esc interrupt            tab agents  ctrl+p commands\n"
    idle = "  ┃  Build · gpt-5.5 gastown\n   /tmp/repo                       7.9K (4%)  ctrl+p commands\n"
    assert runtime.idle(idle)
    assert not runtime.idle(busy)
    assert runtime.activity_on_screen("Rate limited [retrying in 3s attempt #2]") == "[retrying in 3s attempt #2]"
    assert runtime.activity_on_screen(idle) is None
    assert not runtime.nudge("hi").when_busy


def test_its_usage_is_each_answers_newest_record_once_and_a_half_written_line_waits() -> None:
    def line(key: str, model: str, inp: int, out: int, read: int = 0) -> bytes:
        tokens = {"input": inp, "output": out, "reasoning": 1, "cache": {"read": read, "write": 0}}
        return json.dumps({"id": key, "model": model, "provider": "gastown", "tokens": tokens}).encode() + b"\n"

    data = line("m1", "gpt-5.5", 10, 2) + line("m1", "gpt-5.5", 10, 5, read=3) + b"not json\n" + line("m2", "", 7, 1)
    whole = OpenCodeUsage()
    whole.feed(USAGE_FILE, data)
    expected = (
        ModelUsage(model="gpt-5.5", input_tokens=10, output_tokens=6, cache_read_input_tokens=3, messages=1),
        ModelUsage(model="opencode", input_tokens=7, output_tokens=2, messages=1),
    )
    assert whole.snapshot() == expected
    pieces = OpenCodeUsage()
    cut = len(data) - 5
    pieces.feed(USAGE_FILE, data[:cut])
    assert pieces.offsets[USAGE_FILE] < cut, "the unfinished line is left for the next read"
    pieces.feed(USAGE_FILE, data[pieces.offsets[USAGE_FILE] :])
    assert pieces.snapshot() == expected
