"""Real service processes (``python -m services.<name>``) started with their secrets in the environment, as
docker-compose and `gt up` start them: once started, the process holds none of them in its environment, so
nothing it starts inherits them (a child started the plain way, inheriting the environment, sees none); and the
deacon runs only automation files its own user wrote, with an allowlisted environment (the red-team's W2).

Reading ``/proc/<pid>/environ`` would not do: it shows the environment the process was started with, not the
one it holds now (and what its children get). So each service runs under a small launcher that, once the test
says so, starts ``env`` from inside the service process and dumps ``os.environ``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.deacon.automations.shell import BASE_ENV
from shared.bus import auth_callout
from shared.core.config import TownConfig
from tests.helpers import wait_until
from tests.service_process import ManagedProcess

LAUNCHER = """
import json, os, runpy, subprocess, sys, threading, time
trigger, dump, module = sys.argv[1:4]

def probe():
    while not os.path.exists(trigger):
        time.sleep(0.05)
    child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    with open(dump + ".tmp", "w") as out:
        json.dump({"environ": dict(os.environ), "child": child}, out)
    os.rename(dump + ".tmp", dump)

threading.Thread(target=probe, daemon=True).start()
sys.argv = [module, *sys.argv[4:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
OTHER_UID = 54321


def secrets() -> dict[str, str]:
    return {
        "NATS_USER": "svc-user",
        "NATS_PASSWORD": "svc-password-1",
        "NATS_PASSWORD_FILE": "/run/secrets/svc.password",
        "REFINERY_NATS_PASSWORD": "refinery-password-2",
        "GT_AGENT_NATS_USER": "agent",
        "GT_AGENT_NATS_PASSWORD": "agent-password-3",
        "GT_AUTH_ISSUER_SEED": auth_callout.new_issuer_seed(),
        "GT_SESSION_KEY": "session-key-secret-4-0123456789",
        "GT_NATS_AUTH_PASSWORD": "auth-password-5",
        "GT_NATS_SYS_PASSWORD": "sys-password-6",
        "GT_NATS_MAYOR_PASSWORD": "mayor-password-7",
    }


class Launched:
    def __init__(self, service: str, env: dict[str, str], root: Path) -> None:
        self.trigger = root / f"{service}.probe"
        self.dump = root / f"{service}.json"
        argv = [sys.executable, "-c", LAUNCHER, str(self.trigger), str(self.dump), f"services.{service}"]
        argv += ["--log-json", "--patrol-interval", "0.5"]
        self.proc = ManagedProcess(argv, env, root / f"{service}.log")

    def environment(self) -> tuple[dict[str, str], dict[str, str]]:
        """Once the service has started: its ``os.environ``, and the environment a child inherits from it."""
        wait_until(lambda: self.proc.logged("service_starting"), timeout=60, message=self.proc.log_text()[-3000:])
        self.trigger.touch()
        wait_until(self.dump.exists, timeout=30, message=self.proc.log_text()[-3000:])
        seen = json.loads(self.dump.read_text())
        child = dict(line.split("=", 1) for line in seen["child"].splitlines() if "=" in line)
        return seen["environ"], child


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[list[Launched]]:
    started: list[Launched] = []
    yield started
    for each in started:
        each.proc.stop()


def start(launch: list[Launched], service: str, env: dict[str, str], root: Path) -> Launched:
    launched = Launched(service, env, root)
    launched.proc.start()
    launch.append(launched)
    return launched


def base_env(gt_env: dict[str, str], town: TownConfig, held: dict[str, str]) -> dict[str, str]:
    return {
        **gt_env,
        **held,
        "NATS_URL": town.nats_url,
        "GT_HOME": str(town.gt_home),
        "GT_WATCHED_SERVICES": "",
        "GT_TMUX_SOCKET": f"gt-secrets-{uuid.uuid4().hex[:8]}",
    }


def assert_holds_none(service: str, held: dict[str, str], environ: dict[str, str], child: dict[str, str]) -> None:
    assert sorted(set(held) & set(environ)) == [], f"the {service} still holds them"
    assert sorted(set(held) & set(child)) == [], f"a child of the {service} inherited them"
    assert sorted(set(held.values()) & set(child.values())) == [], f"a child of the {service} has their values"


@pytest.mark.parametrize("service", ["witness", "refinery", "deacon", "mayor"])
def test_a_service_started_with_its_secrets_holds_none_once_started(
    service: str, town: TownConfig, gt_env: dict[str, str], tmp_path: Path, launch: list[Launched]
) -> None:
    held = secrets()
    env = base_env(gt_env, town, held)
    try:
        launched = start(launch, service, env, tmp_path)
        environ, child = launched.environment()
    finally:
        subprocess.run(["tmux", "-L", env["GT_TMUX_SOCKET"], "kill-server"], capture_output=True, check=False)
    assert_holds_none(service, held, environ, child)
    assert environ["NATS_URL"] == town.nats_url, "settings stay"
    [starting] = launched.proc.logged("service_starting")
    assert starting["secrets_forgotten"] == sorted(held)


def dump_check(path: Path) -> str:
    return f'env | sort > "{path}"; exit 1'


def test_the_deacon_refuses_automation_files_others_wrote_and_runs_its_own_without_credentials(
    town: TownConfig, gt_env: dict[str, str], tmp_path: Path, launch: list[Launched]
) -> None:
    assert os.geteuid() == 0, "this test gives a file to another user: run it as root (the CI does)"
    old = os.umask(0o022)
    try:
        automations = tmp_path / "automations"
        automations.mkdir()
        dumps = tmp_path / "dumps"
        dumps.mkdir(mode=0o777)

        def write(name: str, check: str) -> Path:
            path = automations / f"{name}.toml"
            path.write_text(f'[automation]\ngate = "condition"\ncheck = {json.dumps(check)}\ninterval = "1s"\n')
            path.write_text(path.read_text() + 'exec = "true"\n')
            return path

        write("operator", dump_check(dumps / "operator.env"))
        # W2: what an agent drops into the automations directory (the shared GT_HOME's): group-writable as with
        # GT_UMASK=007, or its own file when agents run as another OS user.
        write("dropped", dump_check(dumps / "dropped.env")).chmod(0o664)
        os.chown(write("foreign", dump_check(dumps / "foreign.env")), OTHER_UID, OTHER_UID)
    finally:
        os.umask(old)
    held = secrets()
    env = {**base_env(gt_env, town, held), "GT_AUTOMATIONS_DIR": str(automations)}
    deacon = start(launch, "deacon", env, tmp_path)

    wait_until((dumps / "operator.env").exists, timeout=60, message=deacon.proc.log_text()[-3000:])
    refused = {event["automation"]: event for event in deacon.proc.logged("automation_file_refused")}
    assert sorted(refused) == ["dropped", "foreign"]
    assert refused["dropped"]["file"] == str(automations / "dropped.toml")
    assert "writable by group" in refused["dropped"]["reason"]
    assert f"owned by uid {OTHER_UID}" in refused["foreign"]["reason"]
    wait_until(lambda: len((dumps / "operator.env").read_text().splitlines()) > 3, timeout=10)
    seen = dict(line.split("=", 1) for line in (dumps / "operator.env").read_text().splitlines() if "=" in line)
    shell = {"PWD", "SHLVL", "_"}  # what sh itself sets
    allowed = {*BASE_ENV, "GT_AUTOMATION", "NATS_URL", "GT_HOME", *shell}
    assert sorted(set(seen) - allowed) == [], "an allowlisted environment"
    assert_holds_none("deacon's automation", held, {}, seen)
    assert (seen["GT_AUTOMATION"], seen["NATS_URL"]) == ("operator", town.nats_url)
    assert not [name for name in os.listdir(dumps) if name != "operator.env"], "a refused file's check ran"
