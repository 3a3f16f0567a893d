"""What this project ships for running NATS and the stack: valid, and durable (fsync on every write)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shared.embedded import SERVER_CONFIG, find_server_binary
from tests.conftest import REPO_ROOT

NATS_CONFIGS = sorted((REPO_ROOT / "ops" / "nats").glob("*.conf"))


def test_there_are_nats_configs_to_check() -> None:
    assert NATS_CONFIGS


@pytest.mark.parametrize("path", NATS_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_nats_config_is_valid_and_syncs_always(path: Path) -> None:
    assert re.search(r"^\s*sync_interval:\s*always\s*$", path.read_text(), re.MULTILINE), path
    check = subprocess.run([find_server_binary(), "-c", str(path), "-t"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_the_embedded_servers_config_syncs_always_and_is_valid(tmp_path: Path) -> None:
    assert "sync_interval: always" in SERVER_CONFIG
    conf = tmp_path / "embedded.conf"
    conf.write_text(SERVER_CONFIG.format(host="127.0.0.1", port=4222, http_port=8222, store_dir=tmp_path, name="t"))
    check = subprocess.run([find_server_binary(), "-c", str(conf), "-t"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_docker_compose_file_is_valid_for_the_classic_parser() -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose is needed (./dev installs it with apt-get)"
    check = subprocess.run(
        [compose, "-f", str(REPO_ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
    )
    assert check.returncode == 0, check.stderr
    services = subprocess.run(
        [compose, "-f", str(REPO_ROOT / "docker-compose.yml"), "config", "--services"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout.split()
    assert set(services) == {"nats", "mayor", "witness", "refinery", "deacon"}
