"""The chaos run's NATS: one server, or three clustered nodes whose streams have three replicas.

Each node is a real ``nats-server`` with its own store directory (``EmbeddedServer``); a cluster adds a
``cluster`` block with routes to the two other nodes. ``kill`` is SIGKILL, as a lost host or an OOM kill.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from gt.embedded_nats import EmbeddedServer, free_port
from tests.compose_stack import node_stream_state

CLUSTER_NAME = "gt-chaos"


class NatsNodes:
    def __init__(self, root: Path, *, cluster: bool) -> None:
        self.cluster = cluster
        if not cluster:
            self.nodes = {"nats": EmbeddedServer(root / "nats")}
            return
        names = [f"nats-{i}" for i in (1, 2, 3)]
        route_ports = {name: free_port() for name in names}
        self.nodes = {}
        for name in names:
            node_dir = root / name
            node_dir.mkdir(parents=True, exist_ok=True)
            routes = ", ".join(f"nats://127.0.0.1:{port}" for other, port in route_ports.items() if other != name)
            include = node_dir / "cluster.conf"
            include.write_text(
                f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{route_ports[name]}\n"
                f"  routes: [{routes}]\n}}\n"
            )
            self.nodes[name] = EmbeddedServer(node_dir, name=name, include=include)

    @property
    def replicas(self) -> int:
        return len(self.nodes)

    @property
    def url(self) -> str:
        """Every node's client URL, as ``NATS_URL`` takes them (comma-separated)."""
        return ",".join(node.url for node in self.nodes.values())

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    def start(self, timeout: float = 60.0) -> None:
        for node in self.nodes.values():
            node.start()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float) -> None:
        """Every node answers its health check with JetStream enabled (a cluster has elected its meta leader)."""
        deadline = time.monotonic() + timeout
        for name in self.nodes:
            while not self.healthy(name):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"NATS node {name} not healthy within {timeout:g}s")
                time.sleep(0.2)

    def healthy(self, name: str) -> bool:
        node = self.nodes[name]
        url = f"http://{node.host}:{node.http_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def kill(self, name: str) -> None:
        self.nodes[name].kill()

    def start_node(self, name: str) -> None:
        self.nodes[name].start()

    def kill_all_and_restart(self, down_s: float = 1.0) -> None:
        for node in self.nodes.values():
            node.kill()
        time.sleep(down_s)
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def stream_state(self, name: str, stream: str) -> dict[str, Any] | None:
        """The stream as this node stores it (its own replica), from its /jsz monitoring endpoint."""
        node = self.nodes[name]
        return node_stream_state(f"http://{node.host}:{node.http_port}", stream)
