"""Run an operator's shell command (an automation's exec action or condition check) with a time limit.

The command runs through ``sh -c`` in a process group of its own, so a timeout or the deacon stopping ends
everything it started. Only the tail of its output is kept: a chatty command cannot fill the deacon's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.core.config import TownConfig

BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
"""What a command of the town's (an automation's exec action or condition check, a CI gate's check) gets of the
deacon's environment (besides what ``command_env`` adds): never its NATS credentials (``NATS_USER``,
``NATS_PASSWORD``, ...) or the town's other settings. A command that acts on the town with ``gt`` names its own
credentials (docs/automations.md)."""
TIMEOUT_EXIT = 124
"""The exit code recorded for a command that ran out of time (as coreutils ``timeout`` reports it)."""
KILL_GRACE_S = 2.0
TAIL_BYTES = 4000


class ShellResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int
    """The command's exit code; 128 + N when signal N ended it; ``TIMEOUT_EXIT`` when it ran out of time."""
    output: str
    """The tail of its standard output and error, interleaved."""
    timed_out: bool = False
    seconds: float = 0.0


def command_env(config: TownConfig, **extra: str) -> dict[str, str]:
    """A town command's environment: ``BASE_ENV`` of the deacon's, the town's ``NATS_URL`` and ``GT_HOME``, and
    ``extra`` (the run's own variables)."""
    return {
        **{key: os.environ[key] for key in BASE_ENV if key in os.environ},
        "NATS_URL": config.nats_url,
        "GT_HOME": str(config.gt_home),
        **extra,
    }


async def run(command: str, *, cwd: Path, env: Mapping[str, str], timeout: float) -> ShellResult:
    """Run ``command`` and wait for it, at most ``timeout`` seconds.

    Raises:
        OSError: it could not be started (no ``sh``, ``cwd`` missing).
    """
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        command,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    tail = bytearray()
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                assert proc.stdout is not None
                while chunk := await proc.stdout.read(65536):
                    tail += chunk
                    del tail[:-TAIL_BYTES]
                await proc.wait()
        except TimeoutError:
            timed_out = True
            await _stop_group(proc)
    finally:
        if proc.returncode is None:
            # Cancelled (the deacon is stopping): nothing it started may outlive it.
            _signal_group(proc.pid, signal.SIGKILL)
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    exit_code = TIMEOUT_EXIT if timed_out else (128 - code if code < 0 else code)
    text = tail.decode("utf-8", errors="replace").strip()
    return ShellResult(
        exit_code=exit_code, output=text, timed_out=timed_out, seconds=round(time.monotonic() - started, 3)
    )


async def _stop_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the command's process group, SIGKILL it if it is still there after a grace."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(KILL_GRACE_S):
            await proc.wait()
    except TimeoutError:
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # The group is the child's own (start_new_session): its id is the child's pid, which cannot have been
    # reused while the child is unreaped.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
