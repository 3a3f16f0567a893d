"""Automation files: every gate and action parses; every mistake is named by file and field; one broken file
never hides the others; edited files are read again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.deacon.automations.definitions import (
    Automation,
    AutomationCatalog,
    InvalidAutomation,
    load_settings,
    parse,
    subject_matches,
)
from shared.core.durations import parse_duration


def ok(text: str, name: str = "nightly") -> Automation:
    parsed = parse(name, f"/town/automations/{name}.toml", text)
    assert isinstance(parsed, Automation), parsed
    return parsed


def bad(text: str, name: str = "nightly") -> InvalidAutomation:
    parsed = parse(name, f"/town/automations/{name}.toml", text)
    assert isinstance(parsed, InvalidAutomation), parsed
    return parsed


class TestEveryGateAndAction:
    def test_cooldown_with_exec(self) -> None:
        a = ok('[automation]\ndescription = "tidy"\ngate = "cooldown"\ninterval = "10m"\nexec = "./tidy.sh"\n')
        assert (a.gate, a.interval_s, a.action, a.exec, a.timeout_s, a.enabled) == (
            "cooldown",
            600.0,
            "exec",
            "./tidy.sh",
            300.0,
            True,
        )
        assert a.description == "tidy"

    def test_cron_with_a_timezone(self) -> None:
        a = ok('[automation]\ngate = "cron"\nschedule = "0 3 * * *"\ntimezone = "Europe/Berlin"\nexec = "true"\n')
        assert a.schedule is not None
        assert (a.schedule.text, a.timezone) == ("0 3 * * *", "Europe/Berlin")

    def test_event_with_and_without_a_subject_filter(self) -> None:
        assert ok('[automation]\ngate = "event"\non = "bead.closed"\nexec = "true"\n').on == "bead.closed"
        a = ok('[automation]\ngate = "event"\non = "rig.mass_death"\nsubject = "gt.evt.rig.demo"\nexec = "true"\n')
        assert (a.on, a.subject) == ("rig.mass_death", "gt.evt.rig.demo")

    def test_an_event_gate_may_follow_another_automation(self) -> None:
        text = '[automation]\ngate = "event"\non = "automation.completed"\nsubject = "gt.evt.automation.build"\n'
        assert ok(text + 'exec = "true"\n', name="deploy").subject == "gt.evt.automation.build"

    def test_condition_with_its_defaults_and_with_its_own_timings(self) -> None:
        a = ok('[automation]\ngate = "condition"\ncheck = "test -e /tmp/x"\nexec = "true"\n')
        assert (a.check, a.interval_s, a.check_timeout_s) == ("test -e /tmp/x", 60.0, 10.0)
        a = ok('[automation]\ngate = "condition"\ncheck = "true"\ninterval = "30s"\ncheck_timeout = 5\nexec = "x"\n')
        assert (a.interval_s, a.check_timeout_s) == (30.0, 5.0)

    def test_manual_with_a_formula_action(self) -> None:
        text = (
            '[automation]\ngate = "manual"\nformula = "code-review"\nrig = "demo"\ntitle = "Review"\n'
            'enabled = false\n[automation.vars]\nchange = "main~1"\n'
        )
        a = ok(text)
        assert (a.gate, a.action, a.formula, a.rig, a.title, a.vars, a.enabled) == (
            "manual",
            "formula",
            "code-review",
            "demo",
            "Review",
            {"change": "main~1"},
            False,
        )

    def test_exec_timeout(self) -> None:
        assert ok('[automation]\ngate = "manual"\nexec = "x"\ntimeout = "1h30m"\n').timeout_s == 5400.0


@pytest.mark.parametrize(
    ("keys", "field", "words"),
    [
        ("exec = 'x'", "automation.gate", "is required"),
        ("gate = 'hourly'; exec = 'x'", "automation.gate", "must be one of cooldown, cron"),
        ("gate = 'manual'; exec = 'x'; intreval = '1m'", "automation.intreval", "did you mean 'interval'"),
        ("gate = 'manual'; exec = 'x'; interval = '1m'", "automation.interval", 'only for gate = "cooldown"'),
        ("gate = 'cooldown'; exec = 'x'", "automation.interval", "is required"),
        ("gate = 'cooldown'; interval = '10 minutes'; exec = 'x'", "automation.interval", "not a duration"),
        ("gate = 'cooldown'; interval = 0; exec = 'x'", "automation.interval", "from 1s to 7d"),
        ("gate = 'cooldown'; interval = true; exec = 'x'", "automation.interval", "must be a duration"),
        ("gate = 'cron'; exec = 'x'", "automation.schedule", "is required"),
        ("gate = 'cron'; schedule = '61 * * * *'; exec = 'x'", "automation.schedule", "minute: value 61"),
        (
            "gate = 'cron'; schedule = '* * * * *'; timezone = 'Mars/Olympus'; exec = 'x'",
            "automation.timezone",
            "not a time zone",
        ),
        ("gate = 'event'; exec = 'x'", "automation.on", "is required"),
        ("gate = 'event'; on = 'bead.close'; exec = 'x'", "automation.on", "did you mean bead.closed"),
        (
            "gate = 'event'; on = 'bead.closed'; subject = 'gt.evt.rig.demo'; exec = 'x'",
            "automation.subject",
            "can never match",
        ),
        (
            "gate = 'event'; on = 'bead.closed'; subject = 'gt.evt.bead.>.x'; exec = 'x'",
            "automation.subject",
            "not a subject pattern",
        ),
        ("gate = 'event'; on = 'automation.failed'; exec = 'x'", "automation.subject", "is required"),
        (
            "gate = 'event'; on = 'automation.failed'; subject = 'gt.evt.automation.*'; exec = 'x'",
            "automation.subject",
            "fire itself",
        ),
        ("gate = 'condition'; exec = 'x'", "automation.check", "is required"),
        ("gate = 'manual'", "automation.exec", "neither is given"),
        ("gate = 'manual'; exec = 'x'; formula = 'f'; rig = 'r'", "automation.exec", "both are given"),
        ("gate = 'manual'; exec = ''", "automation.exec", "non-empty string"),
        ("gate = 'manual'; exec = 'x'; rig = 'demo'", "automation.rig", "goes with a formula"),
        ("gate = 'manual'; formula = 'f'", "automation.rig", "is required"),
        ("gate = 'manual'; formula = 'F.x'; rig = 'demo'", "automation.formula", "not a formula name"),
        ("gate = 'manual'; formula = 'f'; rig = 'demo'; timeout = '1m'", "automation.timeout", "until the bead"),
        ("gate = 'manual'; formula = 'f'; rig = 'demo'; vars = { 1x = 'a' }", "automation.vars.1x", "not a var name"),
        ("gate = 'manual'; formula = 'f'; rig = 'demo'; vars = { n = 3 }", "automation.vars.n", "must be a string"),
        (
            "gate = 'manual'; formula = 'f'; rig = 'demo'; vars = { big = '" + "x" * 70_000 + "' }",
            "automation.vars",
            "value of 'big' is over 65536 characters",
        ),
        (
            "gate = 'manual'; formula = 'f'; rig = 'demo'; vars = { "
            + ", ".join(f"v{i} = 'x'" for i in range(300))
            + " }",
            "automation.vars",
            "has 300 keys; the limit is 256",
        ),
        ("gate = 'manual'; exec = 'x'; enabled = 'yes'", "automation.enabled", "true or false"),
    ],
)
def test_each_mistake_names_the_file_and_the_field(keys: str, field: str, words: str) -> None:
    """``keys``: the lines of the [automation] table, separated by "; "."""
    broken = bad("[automation]\n" + keys.replace("; ", "\n") + "\n")
    assert broken.field == field
    assert words in broken.problem
    assert broken.message.startswith(f"automation file /town/automations/nightly.toml: `{field}` ")


@pytest.mark.parametrize(
    ("text", "words"),
    [("[automation\ngate = 'manual'\n", "is not valid TOML"), ("title = 'x'\n", "holds one [automation] table")],
)
def test_a_file_that_is_not_an_automation_table_is_named(text: str, words: str) -> None:
    broken = bad(text)
    assert words in broken.message
    assert broken.message.startswith("automation file /town/automations/nightly.toml: ")


def test_the_name_comes_from_the_file_and_must_be_an_id() -> None:
    broken = bad('[automation]\ngate = "manual"\nexec = "x"\n', name="Nightly Report")
    assert "must match" in broken.problem


def test_durations() -> None:
    assert [parse_duration(v) for v in ("30s", "10m", "2h", "1d", "1h30m", "1.5m", 45, 2.5)] == [
        30.0,
        600.0,
        7200.0,
        86400.0,
        5400.0,
        90.0,
        45.0,
        2.5,
    ]
    for text in ("10", "m10", "10 m", "1w", ""):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(text)


def test_subject_patterns_match_as_nats_does() -> None:
    assert subject_matches("gt.evt.bead.*", "gt.evt.bead.hq-1")
    assert subject_matches("gt.evt.>", "gt.evt.bead.hq-1")
    assert not subject_matches("gt.evt.bead.*", "gt.evt.bead")
    assert not subject_matches("gt.evt.bead.hq-1", "gt.evt.bead.hq-2")
    assert not subject_matches("gt.evt.*", "gt.evt.bead.hq-1")


class TestCatalog:
    def test_a_broken_file_is_reported_and_the_others_load(self, tmp_path: Path) -> None:
        (tmp_path / "good.toml").write_text('[automation]\ngate = "manual"\nexec = "true"\n')
        (tmp_path / "broken.toml").write_text('[automation]\ngate = "cooldown"\nexec = "true"\n')
        (tmp_path / "notes.txt").write_text("not an automation")
        (tmp_path / "sub.toml").mkdir()
        defs = AutomationCatalog(tmp_path).load()
        assert list(defs.automations) == ["good"]
        assert list(defs.invalid) == ["broken"]
        assert defs.invalid["broken"].field == "automation.interval"
        assert str(tmp_path / "broken.toml") in defs.invalid["broken"].message

    def test_an_edited_file_is_read_again_and_a_removed_one_is_gone(self, tmp_path: Path) -> None:
        path = tmp_path / "job.toml"
        path.write_text('[automation]\ngate = "manual"\nexec = "true"\n')
        catalog = AutomationCatalog(tmp_path)
        assert catalog.load().automations["job"].exec == "true"
        path.write_text('[automation]\ngate = "manual"\nexec = "false"\n')
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime even on coarse clocks
        assert catalog.load().automations["job"].exec == "false"
        path.unlink()
        assert catalog.load().automations == {}

    def test_a_missing_directory_holds_no_automations(self, tmp_path: Path) -> None:
        defs = AutomationCatalog(tmp_path / "nowhere").load()
        assert (defs.automations, defs.invalid) == ({}, {})


def test_settings_from_the_environment(tmp_path: Path) -> None:
    assert load_settings({}, tmp_path).directory == tmp_path / "automations"
    custom = load_settings({"GT_AUTOMATIONS_DIR": str(tmp_path / "x"), "GT_AUTOMATION_GRACE": "2.5"}, tmp_path)
    assert (custom.directory, custom.grace_s) == (tmp_path / "x", 2.5)
    with pytest.raises(ValueError, match="GT_AUTOMATION_GRACE"):
        load_settings({"GT_AUTOMATION_GRACE": "soon"}, tmp_path)
