"""The compose stack in containers (podman, the classic docker-compose, the project's unchanged files) across
what its operators do to it: a service container killed mid-work, ``down`` then ``up`` (the volumes keep the log),
and the services recreated from a rebuilt image, which replay the log to the same state. Needs the stack in
containers: ``./dev test`` sets up podman as root (tests/compose_stack.py, ``podman_compose_ready``)."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compose_stack import USERS, ComposeStack, Operator, podman_compose_ready, running_stack, town_services
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(
    not podman_compose_ready(), reason="the stack in containers needs rootful podman (./dev test sets it up as root)"
)


@pytest.fixture
def stack(tmp_path: Path, gt_env: dict[str, str]) -> Iterator[ComposeStack]:
    passwords = {user: secrets.token_hex(12) for user in USERS}
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as running:
        assert isinstance(running, ComposeStack)
        yield running


def _gt(stack: ComposeStack, gt_env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return Operator(stack, gt_env, home, timeout=180, GT_HELPER="0").run(*args)


def _beads(stack: ComposeStack, gt_env: dict[str, str], home: Path) -> list[dict[str, Any]]:
    listed = _gt(stack, gt_env, home, "bead", "list", "--all", "--limit", "0", "--json")
    assert listed.returncode == 0, listed.stderr
    beads: list[dict[str, Any]] = json.loads(listed.stdout)
    return sorted(beads, key=lambda b: str(b["id"]))


@pytest.mark.compose_stack
@pytest.mark.timeout(1200)
def test_the_stack_keeps_its_state_through_a_killed_service_down_and_up_and_a_rebuilt_image(
    stack: ComposeStack, gt_env: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "operator"

    # A fresh stack starts quietly: what the services wait for while the cluster forms (JetStream not answering
    # yet, no snapshot store) is said at info; nothing at warning or error.
    for service in town_services(stack.model):
        out = stack.compose("logs", "--no-color", service).stdout
        records = [json.loads(line.split("| ", 1)[1]) for line in out.splitlines() if "| {" in line]
        assert records, f"{service} logged nothing"
        loud = [r for r in records if r.get("level") in ("warning", "error", "critical")]
        assert not loud, (service, loud)

    # The mayor killed (kill -9 of its container) while operators' creates are under way: each create gets its
    # one outcome once a mayor is back (they wait for it), none fails, none is stored twice.
    results: list[subprocess.CompletedProcess[str]] = []

    def creates() -> None:
        results.extend(_gt(stack, gt_env, home, "bead", "create", f"sent around a mayor kill {n}") for n in range(12))

    sender = threading.Thread(target=creates)
    sender.start()
    while sender.is_alive() and not results:
        sender.join(0.05)  # the first create answered: the rest are under way
    stack.kill("mayor")
    stack.start_service("mayor")
    sender.join(timeout=600)
    assert not sender.is_alive()
    assert [r.returncode for r in results] == [0] * 12, [r.stderr for r in results if r.returncode]
    made = [r.stdout.strip() for r in results]
    before = _beads(stack, gt_env, home)
    assert sorted(b["id"] for b in before) == sorted(made)
    titles = Counter(b["title"] for b in before)
    assert titles == Counter(f"sent around a mayor kill {n}" for n in range(12)), titles  # each stored once

    # `down` keeps the named volumes: after `up`, the log is there and the services replay it to the same beads.
    stack.down(volumes=False)
    stack.compose("up", "-d", timeout=600)
    stack.wait_healthy()
    assert _beads(stack, gt_env, home) == before

    # A rebuilt image (here: for another source revision, a new image whose last layer, its revision label, is
    # all that differs) recreates the service containers from it; they replay the log to the same state.
    ids = {service: stack.compose("ps", "-q", service).stdout.strip() for service in town_services(stack.model)}
    image = stack.image_id()
    stack.compose_env["GT_REVISION"] = "rebuilt-" + uuid.uuid4().hex[:12]
    stack.compose("build", "mayor", timeout=900)
    assert stack.image_id() != image
    stack.compose("up", "-d", timeout=600)
    stack.wait_healthy()
    recreated = {service: stack.compose("ps", "-q", service).stdout.strip() for service in town_services(stack.model)}
    assert all(recreated[s] != ids[s] for s in ids), (ids, recreated)
    assert _beads(stack, gt_env, home) == before
    again = _gt(stack, gt_env, home, "bead", "create", "after the rebuild")
    assert again.returncode == 0, again.stderr
