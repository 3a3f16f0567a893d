"""A long command of the reference agent (the rig's tests), run with heartbeats.

While the command runs the agent calls ``gt heartbeat`` every quarter of the shorter of the rig's stall limit and
its hook lease's TTL: each call is a sign of life the witness reads and renews the hook lease, so a suite that
runs longer than ``stall_after`` is neither warranted ``stalled`` nor fenced out. The beats come from the agent's
own loop, between waits for the command: an agent that hangs (or is stopped) sends none and is caught by the
stall limit as before. A command that hangs is caught by ``GT_AGENT_COMMAND_TIMEOUT`` (seconds, an hour by
default): past it the agent stops the command and everything it started, and gives up on the session (the
witness respawns the bead up to the rig's ``max_respawns``, then escalates it). A heartbeat that says the session
lost its hook stops the command too: the bead is another session's now.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from gt.agent_start import command_timeout, say
from gt.cli.patience import PATIENCE_ENV

EXIT_REJECTED = 1
"""``gt heartbeat``'s exit code for a session that no longer holds its hook (gt/cli/common.py)."""
MIN_BEAT_S = 1.0
OUTPUT_TAIL = 4000
"""Characters of a command's output the agent keeps (the end: where a test run says what failed)."""


class CommandError(RuntimeError):
    """The command could not be let run to its end: it ran past its time limit, or the session lost its hook."""


def beat_every(stall_after_s: float | None, env: Mapping[str, str] = os.environ) -> float:
    """Seconds between heartbeats: a quarter of the rig's stall limit or of the hook lease's TTL (``GT_LEASE_TTL``,
    which the witness sets), the shorter; a limit lowered while the command runs still leaves three beats.
    ``stall_after_s`` None or 0: the default limit, 600 s."""
    limits = [stall_after_s or 600.0]
    ttl = env.get("GT_LEASE_TTL", "")
    try:
        if float(ttl) > 0:
            limits.append(float(ttl))
    except ValueError:
        pass  # not set, or not a number: the stall limit alone
    return max(MIN_BEAT_S, min(limits) / 4)


def run(command: str, cwd: Path, *, what: str, every_s: float) -> tuple[int, str]:
    """Run ``command`` with ``sh -c`` in ``cwd``, heartbeating every ``every_s`` while it runs; its exit code and
    the end of its output (stdout and stderr as they came).

    Raises:
        CommandError: it ran past ``GT_AGENT_COMMAND_TIMEOUT``, or a heartbeat found the hook lost; the command and
            what it started are stopped first.
    """
    limit = command_timeout()
    started = time.monotonic()
    say(f"{what}: `{command}` (a heartbeat every {every_s:g} s while it runs; stopped after {limit:g} s)")
    with tempfile.TemporaryFile("w+b") as out:
        # The same process group as the agent: whatever ends the session ends the command with it.
        proc = subprocess.Popen(["sh", "-c", command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        while True:
            try:
                code = proc.wait(timeout=every_s)
                break
            except subprocess.TimeoutExpired:
                pass
            ran = time.monotonic() - started
            if ran >= limit:
                _stop(proc)
                raise CommandError(
                    f"{what} ran for more than {limit:g} s (GT_AGENT_COMMAND_TIMEOUT): stopped, taken for hung"
                )
            lost = _heartbeat(f"{what}: running for {ran:.0f} s")
            if lost is not None:
                _stop(proc)
                raise CommandError(f"stopped {what}: {lost}")
        say(f"{what}: exit {code} after {time.monotonic() - started:.0f} s")
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - OUTPUT_TAIL))
        return code, out.read().decode(errors="replace")


def _heartbeat(note: str) -> str | None:
    """One ``gt heartbeat``; None unless it says the session lost its hook (then why). A town that does not
    answer is not waited for here: the command goes on and the next beat tries again."""
    quick = {**os.environ, PATIENCE_ENV: "0"}  # a session's gt calls wait out the town by default (gt.cli.patience)
    beat = subprocess.run(["gt", "heartbeat", "--note", note], capture_output=True, text=True, check=False, env=quick)
    if beat.returncode == EXIT_REJECTED:
        return beat.stderr.strip() or "gt heartbeat: the session lost its hook"
    return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the command and every process below it (a test runner's workers), then reap it."""
    from shared.host import processes  # psutil: only for an agent that has to stop a command

    ref = processes.ref_of(proc.pid)
    if ref is not None:
        processes.stop_tree(ref, timeout=5.0)
    proc.kill()
    proc.wait()
