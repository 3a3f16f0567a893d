"""Agent runtimes' pure parts: which runtime a rig's --agent names, Claude Code's command line, environment,
first-run state and hooks, what its screen says (retrying, idle, a dialog), its restarts, nudges and usage files, and
the plan's failed start for a runtime that never confirmed its start or waits at a dialog, and its continue nudge."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from gt.cli.polecats import stop_reason
from services.witness.plan import Observed, PaneSeen, Policy, plan
from services.witness.plan.actions import ContinueSession, Warrant
from services.witness.state import Nudge, Rig, Session, WitnessState, WorkBead, continue_nudge_id
from shared.model.runtimes import (
    CLAUDE,
    COMMAND,
    GT_AGENT,
    LOCAL_BINARIES,
    SETTINGS_LOCAL,
    ClaudeRuntime,
    CommandRuntime,
    Restart,
    continue_prompt,
    hook_log_line,
    newest_restart,
    refusal,
    runtime_for,
    turn_ended_after_done,
)
from shared.model.usage import Transcript
from tests import records

KEY = "sk-ant-api03-0123456789abcdefghijklmnopqrstuvwxyz"


def test_a_runtime_name_names_its_runtime_and_anything_else_is_a_command_of_its_own() -> None:
    assert runtime_for("claude").name == CLAUDE
    assert runtime_for(" claude ").name == CLAUDE
    assert runtime_for("gt-agent").name == GT_AGENT
    custom = runtime_for("claude -p {beacon}")
    assert custom.name == COMMAND
    assert custom.command("hi there", "") == "claude -p 'hi there'"
    assert runtime_for("gt-agent").command("beacon", "") == "gt-agent"
    assert runtime_for(CLAUDE).confirms_start
    assert not runtime_for("gt-agent").confirms_start


def test_claude_starts_interactive_with_the_beacon_as_its_prompt() -> None:
    line = ClaudeRuntime().command("[gastown] You are polecat ace; it's `gt prime`", "/opt/claude code/claude")
    assert shlex.split(line) == [
        "exec",
        "/opt/claude code/claude",
        "--dangerously-skip-permissions",
        "[gastown] You are polecat ace; it's `gt prime`",
    ]
    assert " -p" not in line  # interactive: an operator can attach, nudges arrive as prompts


def test_claude_gets_a_home_and_config_of_its_own_and_its_settings_from_the_witness() -> None:
    witness = {
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "ANTHROPIC_MODEL": "claude-sonnet-5",
        "ANTHROPIC_CUSTOM_HEADERS": "x-a: b",
        "CLAUDE_CODE_MAX_RETRIES": "2",
        "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "80",
        "DISABLE_TELEMETRY": "1",
        "OPENAI_API_KEY": "not claude's",
        "HOME": "/root",
        "NATS_PASSWORD": "never",
    }
    env = ClaudeRuntime().env(witness, session_dir="/gt/rigs/demo/sessions/s-1", root=True)
    assert env["HOME"] == "/gt/rigs/demo/sessions/s-1/home"
    assert env["CLAUDE_CONFIG_DIR"] == "/gt/rigs/demo/sessions/s-1/home/.claude"
    assert env["GT_SESSION_DIR"] == "/gt/rigs/demo/sessions/s-1"
    assert env["IS_SANDBOX"] == "1"
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_CUSTOM_HEADERS"):
        assert env[name] == witness[name]
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "80", "when it compacts: Claude Code's own setting"
    assert env["DISABLE_TELEMETRY"] == "1"
    assert "OPENAI_API_KEY" not in env
    assert "NATS_PASSWORD" not in env
    as_user = ClaudeRuntime().env(witness, session_dir="/s", root=False)
    assert "IS_SANDBOX" not in as_user


def test_claude_first_run_state_answers_every_screen_for_the_worktree_and_key() -> None:
    state = ClaudeRuntime().first_run_state("/gt/rigs/demo/polecats/ace", {"ANTHROPIC_API_KEY": KEY}, "2.1.332")
    assert state["hasCompletedOnboarding"] is True
    assert state["bypassPermissionsModeAccepted"] is True
    assert state["customApiKeyResponses"] == {"approved": [KEY[-20:]], "rejected": []}
    assert state["projects"]["/gt/rigs/demo/polecats/ace"]["hasTrustDialogAccepted"] is True
    assert state["lastOnboardingVersion"] == "2.1.332"
    without_key = ClaudeRuntime().first_run_state("/w", {}, "")
    assert without_key["customApiKeyResponses"]["approved"] == []
    assert "lastOnboardingVersion" not in without_key


def test_claude_hooks_prime_the_session_keep_it_going_and_record_compaction_and_end() -> None:
    settings = ClaudeRuntime().settings_local("/venv/bin/gt")
    hooks = settings["hooks"]
    assert set(hooks) == {"SessionStart", "PostToolUse", "Stop", "StopFailure", "PreCompact", "SessionEnd"}

    def command(event: str) -> str:
        [group] = hooks[event]
        [hook] = group["hooks"]
        assert hook["type"] == "command"
        return str(hook["command"])

    assert command("SessionStart") == "/venv/bin/gt agent-hook session-start"
    assert command("Stop") == "/venv/bin/gt agent-hook stop"
    assert command("StopFailure") == "/venv/bin/gt agent-hook stop-failure"
    assert "PreCompact" in command("PreCompact")
    assert "$GT_SESSION_DIR/hooks.log" in command("PreCompact")
    assert "SessionEnd" in command("SessionEnd")
    assert "gt " not in command("SessionEnd")
    assert command("PostToolUse") == ': > "$GT_SESSION_DIR/activity"', "every tool call: no Python"
    assert ClaudeRuntime().git_excludes() == (f"/{SETTINGS_LOCAL}",)


def test_the_claude_binary_is_the_configured_one_then_path_then_the_project_local_install(tmp_path: Path) -> None:
    runtime = ClaudeRuntime()
    local = tmp_path / LOCAL_BINARIES / "claude"
    local.parent.mkdir(parents=True)
    local.write_text("#!/bin/sh\n")
    configured = tmp_path / "my-claude"
    configured.write_text("#!/bin/sh\n")

    def nowhere(_name: str) -> None:
        return None

    assert runtime.find_binary({"GT_CLAUDE_BIN": str(configured)}, nowhere, tmp_path)[0] == str(configured)
    missing, places = runtime.find_binary({"GT_CLAUDE_BIN": "/no/such/claude"}, nowhere, tmp_path)
    assert missing is None
    assert "GT_CLAUDE_BIN=/no/such/claude" in places
    assert runtime.find_binary({}, lambda _n: "/usr/bin/claude", tmp_path)[0] == "/usr/bin/claude"
    assert runtime.find_binary({}, nowhere, tmp_path)[0] == str(local)
    gone, places = runtime.find_binary({}, nowhere, tmp_path / "elsewhere")
    assert gone is None
    assert "PATH" in places


def test_claude_needs_a_credential_or_a_logged_in_config_home() -> None:
    runtime = ClaudeRuntime()
    problem = runtime.unavailable({}, logged_in=False)
    assert problem is not None
    assert "ANTHROPIC_API_KEY" in problem
    assert "GT_CLAUDE_CONFIG_DIR" in problem
    assert runtime.unavailable({"ANTHROPIC_API_KEY": KEY}, logged_in=False) is None
    assert runtime.unavailable({"CLAUDE_CODE_OAUTH_TOKEN": "t"}, logged_in=False) is None
    assert runtime.unavailable({}, logged_in=True) is None


def test_the_stop_hook_keeps_a_session_going_while_its_steps_are_open() -> None:
    molecule = {"done": 2, "total": 6, "steps": []}
    step = {"id": "self-review", "title": "Review your own change"}
    data = records.prime(molecule=molecule, current_step=step, bead={"id": "b1"})
    reason = stop_reason(data)
    assert reason is not None
    assert "self-review" in reason
    assert "gt step done self-review" in reason
    all_done = stop_reason(msgspec.structs.replace(data, current_step=None))
    assert all_done is not None
    assert "gt done" in all_done
    assert stop_reason(msgspec.structs.replace(data, status="ended")) is None
    assert stop_reason(msgspec.structs.replace(data, done_intent=True)) is None
    assert stop_reason(msgspec.structs.replace(data, molecule=None)) is None


NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _town(agent: str) -> WitnessState:
    rig = Rig(name="demo", repo="/r.git", prefix="demo", agent_command=agent, added_at=NOW)
    session = Session(
        id="b1-1",
        rig="demo",
        polecat="ace",
        bead="b1",
        worktree="/w",
        branch="polecat/ace/b1",
        tmux_name="gt-demo-ace",
        attempt=1,
        status="started",
        requested_at=NOW,
        started_at=NOW,
        pane_pid=10,
        pid_started=1.0,
    )
    bead = WorkBead(id="b1", title="t", status="hooked", rig="demo", sessions=["b1-1"])
    return WitnessState(rigs={"demo": rig}, sessions={"b1-1": session}, beads={"b1": bead})


def _observe(after_s: float, confirmed: frozenset[str] = frozenset()) -> Observed:
    pane = PaneSeen(name="gt-demo-ace", pane_pid=10, dead=False, created=0, label="b1-1")
    return Observed(
        now=NOW + timedelta(seconds=after_s),
        as_of_seq=100,
        panes={"gt-demo-ace": pane},
        alive={"b1-1": True},
        start_confirmed=confirmed,
    )


def test_a_claude_pane_with_no_start_hook_past_the_deadline_is_a_failed_start_naming_rig_and_session() -> None:
    policy = Policy(rigs_root="/gt/rigs", start_confirm_s=60.0)
    state = _town(CLAUDE)
    assert plan(state, _observe(59), policy) == []
    [warrant] = plan(state, _observe(61), policy)
    assert warrant.reason == "failed_to_start"  # type: ignore[attr-defined]
    detail = warrant.detail  # type: ignore[attr-defined]
    assert "rig demo" in detail
    assert "b1-1" in detail
    assert "SessionStart" in detail
    assert plan(state, _observe(61, frozenset({"b1-1"})), policy) == []
    assert plan(_town("gt-agent"), _observe(61), policy) == [], "gt-agent confirms nothing: its pane is enough"
    assert plan(_town(CustomCommand), _observe(61), policy) == []


CustomCommand = CommandRuntime("claude -p {beacon}").template


def test_refused_credentials_are_a_refusal_and_other_turn_failures_are_not() -> None:
    failure = {"error": "authentication_failed", "details": "API Error: 401  invalid x-api-key"}
    why = refusal("claude", failure)
    assert why is not None
    assert "authentication_failed" in why
    assert "API Error: 401 invalid x-api-key" in why
    for retried in ("rate_limit", "overloaded", "server_error", "unknown", ""):
        assert refusal("claude", {"error": retried}) is None, "Claude Code retries these itself"
    assert refusal("gt-agent", failure) is None, "a runtime without the hook records no failures"


def test_a_refused_key_is_read_from_the_pane_while_claude_still_retries_and_once_it_gave_up() -> None:
    retrying = "✻ 401 scripted unauthorized · retrying in 3s · attempt 3/10\n\u276f \n"
    why = refusal("claude", None, retrying)
    assert why is not None
    assert "401 scripted unauthorized" in why
    gave_up = "● Please run /login · API Error: 401 invalid x-api-key\n"
    assert "API Error: 401" in (refusal("claude", None, gave_up) or "")
    assert refusal("claude", None, "✻ 529 Overloaded · retrying in 3s · attempt 2/10") is None, "retried: fine"
    assert refusal("claude", None, "the server answers 401 when the token is missing") is None, "the agent's work"
    assert refusal("gt-agent", None, retrying) is None


# Screens of the pinned Claude Code (2.1.332), captured from real runs against the scripted model server.
PROMPT_FOOTER = (
    "────────────────────────────────────────\n"
    "\u276f \n"
    "────────────────────────────────────────\n"
    "  ⏵⏵ bypass permissions on (shift+tab to cycle)"
)
IDLE = "\u276f go\n  Ran 2 shell commands\n● fin\n✻ Brewed for 7s · done 5:58 PM\n" + PROMPT_FOOTER
BUSY = (
    "\u276f go\n● Running sleep 4; echo one\n* Discombobulating… (6s · ↓ 28 tokens)\n"
    + PROMPT_FOOTER
    + " · esc to interrupt · ← for agents"
)
RETRYING_529 = "\u276f go\n✻ 529 scripted overloaded · retrying in 7s · attempt 6/10\n" + PROMPT_FOOTER
RETRYING_429 = "\u276f go\n✻ 429 scripted rate_limited · retrying in 3s · attempt 3/10\n" + PROMPT_FOOTER
KEY_QUESTION = (
    "  Detected a custom API key in your environment\n  ANTHROPIC_API_KEY: sk-ant-...ngs-0123456789abcdef\n"
    "  Do you want to use this API key?\n    Yes\n  \u276f No (recommended)\n  Enter to confirm · Esc to cancel"
)
TRUST = (
    " Accessing workspace:\n /w\n Quick safety check: Is this a project you created or one you trust? (Like your own"
    " code, ...)\n \u276f No, exit\n   Yes, I trust this folder\n Enter to confirm · Esc to cancel"
)
THEME = " Let's get started.\n Choose the text style that looks best with your terminal\n \u276f ✔ Dark mode"
BYPASS = (
    "  WARNING: Claude Code running in Bypass Permissions mode\n  ...\n  \u276f No, exit\n    Yes, I accept\n"
    "  Enter to confirm · Esc to cancel"
)


def test_claude_shows_its_retries_of_a_refusing_model_api_as_activity_and_nothing_else() -> None:
    runtime = ClaudeRuntime()
    assert runtime.activity_on_screen(RETRYING_529) == "529 scripted overloaded · retrying in 7s · attempt 6/10"
    assert runtime.activity_on_screen(RETRYING_429) == "429 scripted rate_limited · retrying in 3s · attempt 3/10"
    assert runtime.activity_on_screen(BUSY) is None, "a spinner waiting for a model that never answers is no sign"
    assert runtime.activity_on_screen("✻ API error · retrying in 1s · attempt 1/10") is None, "no answer named"
    assert runtime.activity_on_screen(IDLE) is None
    assert runtime_for("gt-agent").activity_on_screen(RETRYING_529) is None


def test_claude_is_idle_at_its_prompt_with_no_turn_running_and_no_dialog() -> None:
    runtime = ClaudeRuntime()
    assert runtime.idle(IDLE) is True
    assert runtime.idle(BUSY) is False
    assert runtime.idle(RETRYING_529 + " · esc to interrupt") is False
    assert runtime.idle(KEY_QUESTION) is False, "a dialog's selection marker is no prompt"
    assert runtime.idle("") is False
    printed = "● the log said: press esc to interrupt the build\n" + "\n".join(f"line {n}" for n in range(10))
    assert runtime.idle(printed + "\n" + IDLE) is True, "only the bottom of the pane counts"
    assert runtime_for("aider --yes {beacon}").idle(IDLE) is None, "a command line of its own cannot tell"


def test_claude_knows_the_screens_that_wait_for_someone_before_it_starts() -> None:
    runtime = ClaudeRuntime()
    for screen, what in (
        (KEY_QUESTION, "API key"),
        (TRUST, "folder trust"),
        (THEME, "onboarding"),
        (BYPASS, "bypass-permissions"),
        ("  Some new question?\n  \u276f Yes\n  Enter to confirm · Esc to cancel", "a dialog"),
    ):
        found = runtime.blocking_screen(screen)
        assert found is not None, screen
        assert what in found
    assert runtime.blocking_screen(IDLE) is None
    assert runtime.blocking_screen(BUSY) is None
    assert runtime_for("gt-agent").blocking_screen(KEY_QUESTION) is None


def log(*lines: str) -> str:
    """A hook log of ``lines`` (``"<event>[ <detail>]"``)."""
    out = ""
    for line in lines:
        event, _, detail = line.partition(" ")
        out += hook_log_line(event, detail, "2026-11-27T12:00:00Z")
    return out


def test_a_restart_with_a_fresh_context_is_read_from_the_hook_log_and_numbered_among_the_starts() -> None:

    assert newest_restart("") is None
    assert newest_restart(log("session-start startup", "stop")) is None, "its first start is no restart"
    cleared = newest_restart(log("session-start startup", "stop", "stop", "SessionEnd", "session-start clear"))
    assert cleared == Restart(number=2, source="clear", turn_ended_since=False)
    went_on = log("session-start startup", "PreCompact", "session-start compact", "stop")
    assert newest_restart(went_on) == Restart(number=2, source="compact", turn_ended_since=True)
    failed = log("session-start startup", "session-start clear", "stop-failure rate_limit")
    assert newest_restart(failed) == Restart(number=2, source="clear", turn_ended_since=True)
    assert newest_restart(log("session-start startup", "session-start clear", "session-start resume")) is None
    assert ClaudeRuntime().restart(log("session-start startup", "session-start clear")) is not None
    assert runtime_for("gt-agent").restart(log("session-start startup", "session-start clear")) is None
    assert "cleared" in continue_prompt(Restart(number=2, source="clear", turn_ended_since=False))
    assert "compacted" in continue_prompt(Restart(number=3, source="compact", turn_ended_since=False))
    assert "Go on with your current step" in continue_prompt(Restart(number=2, source="clear", turn_ended_since=False))


def test_runtimes_say_how_a_nudge_is_typed_and_where_their_usage_is_written() -> None:
    claude = ClaudeRuntime()
    typing = claude.nudge("please also update the changelog")
    assert typing.text == "please also update the changelog"
    assert typing.submit == "Enter"
    assert typing.when_busy, "Claude Code's TUI queues what is typed while a turn runs"
    assert claude.usage_files == ("home/.claude/projects/*/*.jsonl",)
    assert isinstance(claude.usage_reader(), Transcript)
    for other in (runtime_for("gt-agent"), runtime_for("aider --yes {beacon}")):
        assert other.nudge("hi").text == "hi"
        assert other.usage_files == ()
        assert other.usage_reader() is None
        assert other.restart("x session-start clear\n") is None
        assert not other.reads_screen


def test_a_claude_pane_waiting_at_a_dialog_before_its_start_is_escalated_at_once_not_after_the_deadline() -> None:
    policy = Policy(rigs_root="/gt/rigs", start_confirm_s=120.0)
    state = _town(CLAUDE)
    blocked = msgspec.structs.replace(_observe(3), blocked={"b1-1": "its custom API key question ('...')"})
    [warrant] = plan(state, blocked, policy)
    assert isinstance(warrant, Warrant)
    assert warrant.reason == "failed_to_start"
    assert warrant.escalate, "escalated first, so its bead is not respawned into the same screen"
    for named in ("rig demo", "b1-1", "bead b1", "API key question", "no SessionStart hook"):
        assert named in warrant.detail
    started = msgspec.structs.replace(blocked, start_confirmed=frozenset({"b1-1"}))
    assert plan(state, started, policy) == [], "once it started, a dialog on screen is the agent's own business"


def _restarted(restart: Restart, *, idle: bool = True) -> Observed:
    return msgspec.structs.replace(
        _observe(30, frozenset({"b1-1"})),
        restarts={"b1-1": restart},
        idle=frozenset({"b1-1"}) if idle else frozenset(),
    )


def test_a_session_waiting_after_a_clear_or_compaction_is_sent_on_once_per_start() -> None:
    policy = Policy(rigs_root="/gt/rigs")
    state = _town(CLAUDE)
    cleared = Restart(number=2, source="clear", turn_ended_since=False)
    assert plan(state, _restarted(cleared), policy) == [ContinueSession(session="b1-1", number=2, source="clear")]
    assert plan(state, _restarted(cleared, idle=False), policy) == [], "busy: it went on by itself"
    went_on = Restart(number=2, source="compact", turn_ended_since=True)
    assert plan(state, _restarted(went_on), policy) == [], "a turn ended since: nothing to send it on"
    queued = Nudge(
        id=continue_nudge_id("b1-1", 2),
        rig="demo",
        polecat="ace",
        session="b1-1",
        message="go on",
        queued_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        status="delivered",
        version=7,
    )
    nudged = msgspec.structs.replace(state, nudges={queued.id: queued})
    assert plan(nudged, _restarted(cleared), policy) == [], "once per start, whoever plans it (a restarted witness)"
    again = Restart(number=3, source="compact", turn_ended_since=False)
    assert plan(nudged, _restarted(again), policy) == [ContinueSession(session="b1-1", number=3, source="compact")]


def test_a_turn_ends_after_gt_done_only_when_a_stop_follows_its_mark() -> None:
    assert not turn_ended_after_done("")
    assert not turn_ended_after_done(log("session-start startup", "stop", "stop")), "no `gt done` yet"
    assert not turn_ended_after_done(log("session-start startup", "stop", "done")), "the stop came before it"
    assert turn_ended_after_done(log("session-start startup", "stop", "done", "stop"))
    assert turn_ended_after_done(log("session-start startup", "done", "stop-failure API error"))
