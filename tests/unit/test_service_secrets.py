"""No service secret reaches a child process: a service forgets its secrets once it has read its configuration
(``shared.core.config.forget_secrets``, called by the entry point), and git always runs with an allowlisted
environment (``shared.host.git.git_environment``), whatever environment the service itself holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.witness import settings as witness_settings
from shared.core.config import forget_secrets, is_secret
from shared.host import git
from tests.conftest import REPO_ROOT

SECRETS = {
    "NATS_USER": "witness",
    "NATS_PASSWORD": "witness-password",
    "NATS_PASSWORD_FILE": "/run/secrets/witness.password",
    "NATS_CREDS": "/run/secrets/witness.creds",
    "WITNESS_NATS_PASSWORD": "scoped-password",
    "MAYOR_NATS_USER": "mayor",
    "GT_AGENT_NATS_USER": "agent",
    "GT_AGENT_NATS_PASSWORD": "agent-password",
    "GT_AUTH_ISSUER_SEED": "SAISSUERSEED",
    "GT_AUTH_ISSUER_SEED_FILE": "/run/secrets/seed",
    "GT_SESSION_KEY": "session-key-0123456789",
    "GT_SESSION_KEY_FILE": "/run/secrets/session-key",
    "GT_NATS_AUTH_PASSWORD": "auth-password",
    "GT_NATS_AUTH_PASSWORD_FILE": "/run/secrets/auth",
    "GT_NATS_SYS_PASSWORD": "sys-password",
    "GT_NATS_SYS_PASSWORD_FILE": "/run/secrets/sys",
    "GT_NATS_MAYOR_PASSWORD": "mayor-password",
    "GT_NATS_ROUTE_PASSWORD": "route-password",
}
KEPT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/gastown",
    "NATS_URL": "nats://127.0.0.1:4222",
    "NATS_INBOX_PREFIX": "_INBOX_witness",
    "GT_HOME": "/var/lib/gastown",
    "GT_AGENT_ENV": "ANTHROPIC_API_KEY",
    "GT_AGENT_FAULT": "",
    "GT_GIT_ENV": "",
    "ANTHROPIC_API_KEY": "for-the-agents",
}
"""Settings, not secrets, and what the witness hands its agents by name (``GT_AGENT_ENV``): kept."""


def test_every_nats_login_and_town_secret_is_one_and_settings_are_not() -> None:
    assert sorted(name for name in SECRETS if not is_secret(name)) == []
    assert sorted(name for name in KEPT if is_secret(name)) == []


def test_forget_secrets_removes_them_and_keeps_the_rest() -> None:
    env = {**SECRETS, **KEPT}
    assert forget_secrets(env) == sorted(SECRETS)
    assert env == KEPT


def test_the_witness_reads_the_agents_credentials_before_it_forgets_them() -> None:
    env = {**SECRETS, **KEPT}
    loaded = witness_settings.load(env)
    forget_secrets(env)
    assert loaded.agent_credentials == {"NATS_USER": "agent", "NATS_PASSWORD": "agent-password"}
    # Without GT_AGENT_NATS_*: the witness's own, as before (unsecured mode), read at start-up all the same.
    own = {key: value for key, value in SECRETS.items() if not key.startswith("GT_AGENT_")}
    assert witness_settings.load({**own, **KEPT}).agent_credentials == {
        "NATS_USER": "witness",
        "NATS_PASSWORD": "witness-password",
        "NATS_PASSWORD_FILE": "/run/secrets/witness.password",
        "NATS_CREDS": "/run/secrets/witness.creds",
        "NATS_INBOX_PREFIX": "_INBOX_witness",
    }


# ---- git's environment ----------------------------------------------------------------------------------


def test_git_gets_the_allowlist_and_its_identity_never_a_secret_or_a_setting() -> None:
    proxies = {"https_proxy": "http://proxy:3128", "NO_PROXY": "localhost", "SSH_AUTH_SOCK": "/run/ssh.sock"}
    env = git.git_environment({**SECRETS, **KEPT, **proxies, "AWS_SECRET_ACCESS_KEY": "cloud"})
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/home/gastown", **proxies, **git.GIT_ENV}


def test_gt_git_env_names_more_variables_for_a_sites_needs() -> None:
    env = git.git_environment({**KEPT, "GT_GIT_ENV": " GH_TOKEN, CI_CACHE ", "GH_TOKEN": "t", "CI_CACHE": "c"})
    assert (env["GH_TOKEN"], env["CI_CACHE"]) == ("t", "c")
    assert "GT_GIT_ENV" not in env


@pytest.mark.parametrize("name", ["NATS_PASSWORD", "GT_SESSION_KEY", "REFINERY_NATS_PASSWORD", "gt_home"])
def test_gt_git_env_refuses_the_towns_names(name: str) -> None:
    with pytest.raises(ValueError, match=f"GT_GIT_ENV may not name .*{name}"):
        git.git_env_names({"GT_GIT_ENV": f"GH_TOKEN,{name}"})


def test_gt_git_env_refuses_what_is_not_a_name() -> None:
    with pytest.raises(ValueError, match="GT_GIT_ENV must list environment variable names"):
        git.git_env_names({"GT_GIT_ENV": "GH_TOKEN,PATH;rm"})


def test_every_git_runs_with_hooks_and_fsmonitor_off() -> None:
    assert git.GIT_SAFE_CONFIG == ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


# ---- the entry point ------------------------------------------------------------------------------------

PROBE = """
import json, os, subprocess, sys
from shared.service import entrypoint

class Probe:
    async def run(self):
        child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
        with open(sys.argv[1], "w") as out:
            json.dump({"environ": dict(os.environ), "child": child}, out)

    async def shutdown(self):
        pass

sys.exit(entrypoint.main("witness", lambda cfg, settings: Probe(), ["--log-json"]))
"""


def test_a_service_started_with_secrets_holds_none_once_started_and_its_children_inherit_none(
    tmp_path: Path,
) -> None:
    dump = tmp_path / "dump.json"
    env = {**SECRETS, **KEPT, "PATH": "/usr/bin:/bin", "GT_HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(dump)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(dump.read_text())
    child = dict(line.split("=", 1) for line in seen["child"].splitlines() if "=" in line)
    assert sorted(set(SECRETS) & set(seen["environ"])) == [], "the service still holds them"
    assert sorted(set(SECRETS) & set(child)) == [], "a child inherited them"
    assert sorted(set(SECRETS.values()) & set(child.values())) == []
    assert seen["environ"]["ANTHROPIC_API_KEY"] == "for-the-agents", "settings stay (the witness passes this on)"
    assert "secrets_forgotten" in done.stdout + done.stderr


def test_a_bad_gt_git_env_stops_a_service_at_start(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "GT_HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT), "GT_GIT_ENV": "NATS_URL"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "dump.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "GT_GIT_ENV may not name" in done.stdout + done.stderr
