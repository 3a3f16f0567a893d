"""What the town keeps to itself: merge gates run without the services' credentials, the dashboard answers only
the names it is served under, and `gt up` keeps GT_HOME private. Real nats-server, git and `gt`."""

from __future__ import annotations

import contextlib
import http.client
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer, free_port
from gt.town_secrets import dashboard_token
from services.refinery.state import MergeRequest
from shared.core.config import TownConfig
from shared.host.gates.watch import MARKER_VARIABLE
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually, wait_until
from tests.integration.test_town import TownCli
from tests.service_process import ServiceProcess
from tests.witness_town import PolecatTown, polecat_town, run_gt

SECRETS = {
    "NATS_USER": "refinery",
    "NATS_PASSWORD": "refinery-password-1",
    "NATS_CREDS": "/etc/gastown/refinery.creds",
    "GT_AGENT_NATS_PASSWORD": "agent-password-2",
    "GT_NATS_REFINERY_PASSWORD": "refinery-password-1",
    "AWS_SECRET_ACCESS_KEY": "cloud-key-3",
}
"""What a refinery's environment may hold besides what gates need (its NATS user, a cloud key of the host)."""


async def gate_environment(pt: PolecatTown, seen: Path, name: str) -> dict[str, str]:
    """Queue a branch; the environment its test gate ran with, once it merged."""
    bead = await pt.new_bead(f"Gate {name}", prefix="demo")
    branch = f"polecat/{name}/{bead}"
    mr_id = await pt.submit(bead, branch, pt.push_branch(branch, {f"{name}.txt": "x\n"}))

    def merged() -> MergeRequest:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(mr_id)
        assert mr is not None, "not applied yet"
        assert mr.status == "merged", (mr.status, mr.tail)
        return mr

    await assert_eventually(merged, timeout=120, interval=0.1)
    return dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)


async def test_gates_get_an_allowlisted_environment_never_the_refinerys_credentials(
    pt: PolecatTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    seen = tmp_path / "gate.env"
    await pt.add_rig(test_command=f"env > {seen}")
    env = await gate_environment(pt, seen, "allowlist")
    leaked = sorted(key for key, value in env.items() if key in SECRETS or value in SECRETS.values())
    assert leaked == [], f"a gate saw the refinery's credentials: {leaked}"
    # Only the gate run's marker (its watcher finds a leftover of it by it), no setting of the town's.
    assert not [key for key in env if key.startswith(("GT_", "NATS_")) and key != MARKER_VARIABLE], sorted(env)
    assert env["PATH"] == os.environ["PATH"], "gates find their tools"
    assert env["HOME"] == os.environ["HOME"]


async def test_a_rig_names_the_variables_its_gates_may_see_and_rig_update_changes_them(
    pt: PolecatTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gt_env: dict[str, str]
) -> None:
    cli = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home)}
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CI_CACHE_URL", "http://cache.internal")
    monkeypatch.setenv("PIP_INDEX_URL", "http://pypi.internal/simple")
    seen = tmp_path / "gate.env"
    await pt.add_rig(test_command=f"env > {seen}", gate_env=["CI_CACHE_URL"])
    env = await gate_environment(pt, seen, "first")
    assert env.get("CI_CACHE_URL") == "http://cache.internal"
    assert "PIP_INDEX_URL" not in env

    updated = await run_gt(cli, "rig", "update", "demo", "--gate-env", "PIP_INDEX_URL")
    assert updated.returncode == 0, updated.stderr
    assert "gate_env=['PIP_INDEX_URL']" in updated.stdout
    env = await gate_environment(pt, seen, "second")
    assert (env.get("PIP_INDEX_URL"), env.get("CI_CACHE_URL")) == ("http://pypi.internal/simple", None)

    for names in ("NATS_PASSWORD", "GT_AGENT_NATS_PASSWORD", "REFINERY_NATS_PASSWORD", "PATH;rm"):
        refused = await run_gt(cli, "rig", "update", "demo", "--gate-env", f"CI,{names}")
        assert refused.returncode != 0, refused.stdout
        assert names in refused.stderr, refused.stderr
        assert "gate_env" in refused.stderr


# ---- the dashboard's Host check -------------------------------------------------------------------


@pytest.fixture
def dashboard(own_nats_server: EmbeddedServer, gt_env: dict[str, str], tmp_path: Path) -> Iterator[int]:
    """`gt dashboard` on a free port of 127.0.0.1, replayed and healthy; its port."""
    port = free_port()
    env = {**gt_env, "NATS_URL": own_nats_server.url, "GT_HOME": str(tmp_path / "home")}
    provision = subprocess.run(
        [sys.executable, "-m", "gt.cli.main", "init"], env=env, capture_output=True, text=True, check=False
    )
    assert provision.returncode == 0, provision.stderr
    log = (tmp_path / "dashboard.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gt.cli.main", "dashboard", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: get(port, "/healthz", f"127.0.0.1:{port}")[0] == 200, timeout=60)
        yield port
    finally:
        proc.kill()
        proc.wait()
        log.close()


def get(port: int, path: str, host: str | None, cookie: str | None = None) -> tuple[int, bytes]:
    """GET ``path`` with the ``Host`` header given (None: none at all) and ``cookie``; (status, body). 0 when not
    answering."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        if cookie is not None:
            conn.putheader("Cookie", cookie)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, answer.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def test_the_dashboard_answers_only_the_names_it_is_served_under(dashboard: int, tmp_path: Path) -> None:
    port = dashboard
    token = dashboard_token(tmp_path / "home")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", "localhost", f"[::1]:{port}"):
        status, body = get(port, f"/api/state?token={token}", host)
        assert status == 200, (host, status, body)
        assert b"convoys" in body
        status, body = get(port, "/api/state", host, cookie=f"gt_dashboard={token}")
        assert status == 200, (host, status, body)
        # Whoever else reaches loopback (an agent too): no token, nothing of the town.
        for path in ("/api/state", "/events", "/", "/api/bead/gt-abc", f"/api/state?token={token[:-1]}"):
            status, body = get(port, path, host, cookie="gt_dashboard=guess")
            assert status == 401, (host, path, status)
            assert b"convoys" not in body
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends its own name.
    for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}", f"127.0.0.1:{port + 1}"):
        for path in ("/api/state", "/events", "/", "/api/bead/gt-abc", f"/?token={token}"):
            status, body = get(port, path, host)
            assert status == 421, (host, path, status)
            assert b"convoys" not in body
            assert b"<html" not in body.lower()
    status, _ = get(port, "/api/state", None)
    assert status == 421, "a request without Host is refused too"


# ---- GT_HOME is private ------------------------------------------------------------------------------


def loose_modes(root: Path) -> list[str]:
    """Files and directories under ``root`` that the group or others may read, write or enter."""
    loose = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            loose.append(f"{path.relative_to(root)} {stat.filemode(mode)}")
    return loose


def test_up_creates_gt_home_logs_and_run_files_private(gt_env: dict[str, str], tmp_path: Path) -> None:
    town = TownCli({**gt_env}, tmp_path / "town")
    old = os.umask(0o022)  # the usual umask, inherited by `gt up`: what it must not rely on
    try:
        up = town("up", "-d", "--port", "0", "--services", "mayor")
        assert up.returncode == 0, up.stderr
        run_file = town.home / "run" / "town.json"
        assert run_file.exists()
        assert (town.home / "logs" / "mayor.log").exists()
        assert (town.home / "nats" / "nats-server.conf").exists()
        assert loose_modes(town.home) == []
    finally:
        down = town("down")
        os.umask(old)
    assert down.returncode == 0, down.stderr
    assert loose_modes(town.home) == []


async def test_a_service_started_on_its_own_creates_gt_home_private(
    town: TownConfig, nc: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """`gt-witness` started by hand (a unit file, a container), not by `gt up`, under the usual umask: the rig's
    clone and the polecat's worktree it makes, and what its agent (`gt-agent`, `gt`) writes there, are private."""
    async with polecat_town(town, nc, tmp_path, with_witness=False, with_refinery=False) as pt:
        env = {
            **gt_env,
            "NATS_URL": town.nats_url,
            "GT_HOME": str(town.gt_home),
            "GT_TMUX_SOCKET": pt.socket,
            "GT_KILL_GRACE": "1",
        }
        env.pop("GT_UMASK", None)
        witness = ServiceProcess("witness", env, tmp_path / "witness.log")
        old = os.umask(0o022)  # inherited by the witness: what it must not rely on
        try:
            witness.start()
        finally:
            os.umask(old)
        try:
            # The agent commits its first step's file and then hangs, so its worktree stays to be looked at.
            await pt.add_rig(agent_command="GT_AGENT_FAULT=hang=2 gt-agent")
            bead = await pt.new_bead("Keep it to ourselves")
            await pt.sling(bead)
            rigs = town.gt_home / "rigs"

            def written() -> list[Path]:
                return sorted(rigs.rglob("01-*.txt"))

            files: list[Path] = await assert_eventually(
                written, timeout=60, message="the agent wrote its first step in its worktree"
            )
            assert witness.returncode() is None, witness.log_text()[-3000:]
            assert len(list(rigs.rglob("*"))) > 50, "a clone, a worktree and the agent's work are there"
            # A local origin is cloned by hard-linking its objects: those files are the origin's, with its modes.
            origin = {path.stat().st_ino for path in pt.origin.rglob("*") if path.is_file()}
            created = []
            for path in [rigs, *rigs.rglob("*")]:
                with contextlib.suppress(FileNotFoundError):  # a lock file git just removed
                    st = path.lstat()
                    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077 and st.st_ino not in origin:
                        created.append(f"{path.relative_to(rigs)} {stat.filemode(st.st_mode)}")
            assert created == [], (files, created[:20])
        finally:
            witness.stop()


# ---- a service's environment is not readable through /proc ---------------------------------------------

SERVICE = """\
import subprocess
from shared.host.privacy import hide_environment
hidden = hide_environment()
# A gate or an agent: a child of the service (a grandchild reads it the same way), the same OS user.
read = subprocess.run(["sh", "-c", "cat /proc/$PPID/environ"], capture_output=True)
print(hidden, b"s3cret-service-password" in read.stdout, read.returncode)
"""


def as_plain_user() -> None:
    """Root reads every process's /proc entries: the check runs as nobody (as services do, unprivileged)."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


def test_a_services_environment_is_not_readable_by_what_it_starts(tmp_path: Path) -> None:
    # A Python an unprivileged user may run (a root-only venv is not), importing shared.host.privacy from this tree.
    python = "/usr/bin/python3" if os.getuid() == 0 and Path("/usr/bin/python3").exists() else sys.executable
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), "NATS_PASSWORD": "s3cret-service-password"}
    done = subprocess.run(
        [python, "-c", SERVICE], env=env, capture_output=True, text=True, check=False, cwd="/",
        preexec_fn=as_plain_user,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    hidden, leaked, _code = done.stdout.split()
    assert hidden == "True"
    assert leaked == "False", "a child of the service read its password from /proc/<pid>/environ"
