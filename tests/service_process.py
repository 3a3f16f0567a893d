"""A service as a real process of its own (``python -m services.<name>``) that a test starts, kills with SIGKILL,
freezes with SIGSTOP and thaws with SIGCONT, and whose JSON log it reads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self


class ManagedProcess:
    """A process a test starts, kills with SIGKILL, freezes and thaws, and whose log it reads."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.argv[0]} was never started"
        return self.proc.pid

    def start(self) -> Self:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1
        return self

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is frozen), then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON lines of its log (other lines, a traceback say, are left out)."""
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.log_events() if e.get("event") == event]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ServiceProcess(ManagedProcess):
    """A service as a real process of its own: ``python -m services.<name>``."""

    def __init__(self, service: str, env: dict[str, str], log_path: Path, *, args: Sequence[str] = ()) -> None:
        command = [sys.executable, "-m", f"services.{service}", "--log-json", "--patrol-interval", "0.5", *args]
        super().__init__(command, env, log_path)
        self.service = service
