"""What this project ships for running NATS and the stack: valid, and durable (fsync on every write)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from gt.embedded_nats import SERVER_CONFIG, EmbeddedServer, find_server_binary, free_port, write_config
from shared.bus.auth_callout import issuer_public, load_settings
from tests.compose_stack import compose_config, nats_nodes
from tests.conftest import REPO_ROOT
from tests.helpers import wait_until

NATS_DIR = REPO_ROOT / "ops" / "nats"
SERVER_CONFIGS = sorted(p for p in NATS_DIR.glob("*.conf") if "store_dir" in p.read_text())
"""Whole server configs; the others (accounts.conf) are fragments they include."""
ENV_EXAMPLE = REPO_ROOT / "ops" / "gastown.env.example"


def example_env() -> dict[str, str]:
    """What a node's environment holds under compose: the example passwords and a node's own settings."""
    env = dict(os.environ)
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    env.update(
        GT_NATS_NAME="nats-1",
        GT_NATS_LISTEN="127.0.0.1:4222",
        GT_NATS_HTTP="127.0.0.1:8222",
        GT_NATS_STORE="/tmp/gt-config-check",
        GT_NATS_CLUSTER_LISTEN="127.0.0.1:6222",
        **{f"GT_NATS_ROUTE_{i}": f"nats://route:pw@127.0.0.1:{6221 + i}" for i in (1, 2, 3)},
    )
    return env


def test_there_are_nats_configs_to_check() -> None:
    assert {p.name for p in SERVER_CONFIGS} >= {"nats-single.conf", "nats-single-auth.conf", "cluster-node.conf"}


@pytest.mark.parametrize("path", SERVER_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_nats_config_is_valid_and_syncs_always(path: Path) -> None:
    assert re.search(r"^\s*sync_interval:\s*always\s*$", path.read_text(), re.MULTILINE), path
    check = subprocess.run(
        [find_server_binary(), "-c", str(path), "-t"], capture_output=True, text=True, check=False, env=example_env()
    )
    assert check.returncode == 0, check.stderr


def test_a_cluster_node_without_a_password_refuses_to_start_and_names_it() -> None:
    env = example_env()
    del env["GT_NATS_AUTH_PASSWORD"]
    check = subprocess.run(
        [find_server_binary(), "-c", str(NATS_DIR / "cluster-node.conf"), "-t"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert check.returncode != 0
    assert "GT_NATS_AUTH_PASSWORD" in check.stdout + check.stderr


@pytest.mark.parametrize("name", ["nats-single-auth.conf", "cluster-node.conf"])
def test_a_secured_node_without_the_auth_callouts_issuer_refuses_to_start_and_names_it(name: str) -> None:
    env = example_env()
    del env["GT_AUTH_ISSUER"]
    check = subprocess.run(
        [find_server_binary(), "-c", str(NATS_DIR / name), "-t"], capture_output=True, text=True, check=False, env=env
    )
    assert check.returncode != 0
    assert "GT_AUTH_ISSUER" in check.stdout + check.stderr


@pytest.mark.parametrize("name", ["nats-single-auth.conf", "cluster-node.conf"])
@pytest.mark.parametrize("variable", ["GT_NATS_MAX_FILE", "GT_NATS_MAX_MEM"])
def test_a_secured_node_without_the_accounts_jetstream_limits_refuses_to_start_and_names_them(
    name: str, variable: str
) -> None:
    env = example_env()
    del env[variable]
    check = subprocess.run(
        [find_server_binary(), "-c", str(NATS_DIR / name), "-t"], capture_output=True, text=True, check=False, env=env
    )
    assert check.returncode != 0
    assert variable in check.stdout + check.stderr


def test_the_compose_nodes_get_the_accounts_jetstream_limits_with_defaults(tmp_path: Path) -> None:
    """Without them in .env the stack still runs, with the example's values (docker-compose.yml's defaults)."""
    bare = tmp_path / "bare.env"
    bare.write_text(
        "".join(line + "\n" for line in ENV_EXAMPLE.read_text().splitlines() if not line.startswith("GT_NATS_MAX_"))
    )
    model = compose_config(REPO_ROOT, bare)
    example = example_env()
    for node in nats_nodes(model):
        env = model["services"][node]["environment"]
        assert env["GT_NATS_MAX_FILE"] == example["GT_NATS_MAX_FILE"] == "30GB"
        assert env["GT_NATS_MAX_MEM"] == example["GT_NATS_MAX_MEM"] == "256MB"


def test_the_shipped_accounts_have_no_shared_agent_user_and_only_private_inboxes() -> None:
    accounts = (NATS_DIR / "accounts.conf").read_text()
    assert "user: agent" not in accounts
    assert '"_INBOX.>"' not in accounts, "nobody subscribes to everyone's inboxes"
    assert "auth_callout" in accounts


def test_the_example_env_holds_a_matching_issuer_pair() -> None:
    env = example_env()
    assert issuer_public(env["GT_AUTH_ISSUER_SEED"].encode()) == env["GT_AUTH_ISSUER"]
    assert load_settings(env) is not None, "the witness can answer the callout with the example values"


def test_the_embedded_servers_config_syncs_always_and_is_valid(tmp_path: Path) -> None:
    assert "sync_interval: always" in SERVER_CONFIG
    conf = tmp_path / "embedded.conf"
    for http_port in (8222, None):
        write_config(conf, store_dir=tmp_path, port=4222, http_port=http_port, name="t")
        assert ("http: 127.0.0.1:8222" in conf.read_text()) == (http_port is not None), conf.read_text()
        check = subprocess.run(
            [find_server_binary(), "-c", str(conf), "-t"], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stderr


def test_a_town_serves_no_monitoring_unless_asked_for(tmp_path: Path) -> None:
    """`gt up`'s server (``monitor=False`` unless GT_NATS_MONITOR=1): no unauthenticated port that would list every
    connection and stream to an agent on the same machine (a red team read /connz and /jsz from a pane)."""
    server = EmbeddedServer(tmp_path / "nats", monitor=False)
    assert server.http_port is None
    server.start()
    try:
        assert server.proc is not None
        listening = {c.laddr.port for c in psutil.Process(server.proc.pid).net_connections() if c.status == "LISTEN"}
        assert listening == {server.port}, listening
    finally:
        server.stop()


def compose(*args: str, env_file: Path | None = ENV_EXAMPLE) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is needed (./dev installs it with apt-get)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GT_")}
    options = ["--env-file", str(env_file)] if env_file is not None else []
    return subprocess.run(
        [binary, *options, "-f", str(REPO_ROOT / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        env=env,
    )


def test_docker_compose_file_is_valid_for_the_classic_parser() -> None:
    check = compose("config", "-q")
    assert check.returncode == 0, check.stderr
    services = compose("config", "--services")
    assert services.returncode == 0, services.stderr
    assert set(services.stdout.split()) == {
        *("nats-1", "nats-2", "nats-3", "mayor", "witness", "refinery", "deacon", "runner-1", "runner-2")
    }


def test_the_compose_stack_publishes_its_client_ports_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    """Found trying the stack as a new user: the client ports were published on every interface. Opening them is
    a deliberate choice (GT_PUBLISH_HOST), and the cluster hands clients no container addresses."""
    published = compose("config")
    assert published.returncode == 0, published.stderr
    ports = re.compile(r"^\s*- (.*):42\d\d:4222/tcp$", re.MULTILINE)
    assert ports.findall(published.stdout) == ["127.0.0.1"] * 3, published.stdout
    opened = tmp_path / "opened.env"
    opened.write_text(ENV_EXAMPLE.read_text() + "GT_PUBLISH_HOST=0.0.0.0\n")
    wide = compose("config", env_file=opened)
    assert wide.returncode == 0, wide.stderr
    assert ports.findall(wide.stdout) == ["0.0.0.0"] * 3, wide.stdout
    cluster = (REPO_ROOT / "ops" / "nats" / "cluster-node.conf").read_text()
    assert re.search(r"^\s*no_advertise: true$", cluster, re.MULTILINE)


def test_compose_refuses_to_run_without_the_passwords_and_says_which(tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    check = compose("config", "-q", env_file=empty)
    assert check.returncode != 0
    assert "set GT_NATS_" in check.stderr


# ---- the monitoring port is this machine's only ------------------------------------------------------


def monitoring_host(argv: list[str], env: dict[str, str] | None, http_port: int, log: Path) -> str:
    """Run nats-server with ``argv``; the address its monitoring endpoint says it listens on (``/varz``)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: proc.poll() is not None or _answers(http_port), timeout=30)
        assert proc.poll() is None, log.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/varz", timeout=5) as answer:
            return str(json.loads(answer.read())["http_host"])
    finally:
        proc.kill()
        proc.wait()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("name", ["nats-single.conf", "nats-single-auth.conf"])
def test_the_single_node_configs_serve_monitoring_on_loopback_only(name: str, tmp_path: Path) -> None:
    # As shipped, but for the store directory (the container's /data); its includes beside it.
    shutil.copytree(NATS_DIR, tmp_path / "nats")
    conf = tmp_path / "nats" / name
    conf.write_text(conf.read_text().replace('store_dir: "/data"', f'store_dir: "{tmp_path / "store"}"'))
    port, http_port = free_port(), free_port()
    argv = [find_server_binary(), "-c", str(conf), "-p", str(port), "-m", str(http_port)]
    assert monitoring_host(argv, example_env(), http_port, tmp_path / "nats.log") == "127.0.0.1"


def test_the_embedded_server_serves_monitoring_on_loopback_whatever_its_client_address(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "nats", host="0.0.0.0")
    assert server.http_port is not None
    write_config(
        server.config_path, store_dir=server.store_dir, port=free_port(), http_port=server.http_port, host="0.0.0.0"
    )
    argv = [find_server_binary(), "-c", str(server.config_path)]
    assert monitoring_host(argv, None, server.http_port, tmp_path / "nats.log") == "127.0.0.1"


def test_compose_nodes_serve_monitoring_inside_their_container_only(tmp_path: Path) -> None:
    model = compose_config(REPO_ROOT, ENV_EXAMPLE)
    for node in nats_nodes(model):
        service = model["services"][node]
        assert service["environment"]["GT_NATS_HTTP"].startswith("127.0.0.1:"), node
        published = [str(p.get("target") if isinstance(p, dict) else p) for p in service.get("ports") or []]
        assert not [p for p in published if p.endswith("8222")], f"{node} publishes its monitoring port: {published}"
