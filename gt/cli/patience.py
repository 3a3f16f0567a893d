"""How long a ``gt`` call waits for a town that does not answer, and what it says meanwhile (``GT_TOWN_PATIENCE``).

An agent's ``gt`` calls (inside a polecat session) wait out a town restart: ``gt down`` then ``gt up``, a NATS
server restarted, a service restarting. While NATS cannot be reached, or the service a read asks is not running,
the call tries again for up to the patience, says on stderr once what it waits for, and once through, after how
long. Past the patience it fails as before (exit 3), saying that it waited and that the same command is safe to
run again. Every runtime gets this, since it is ``gt`` that waits: Claude Code's ``gt step done`` as much as the
reference agent's (``gt-agent`` gives its calls its own, longer, patience).

Inside a session the default is ``DEFAULT_SESSION_PATIENCE_S``; outside one (an operator) 0: the operator is told
at once. A command stored while its service is down is not waited for: it is durably queued and answered later.
"""

from __future__ import annotations

import contextvars
import os
import sys
import time
from collections.abc import Mapping

from shared.model.runtimes import SESSION_TOWN_PATIENCE_S

PATIENCE_ENV = "GT_TOWN_PATIENCE"
DEFAULT_SESSION_PATIENCE_S = SESSION_TOWN_PATIENCE_S
"""Inside a polecat session (``shared.model.runtimes.SESSION_TOWN_PATIENCE_S``)."""


def town_patience(env: Mapping[str, str] | None = None) -> float:
    """``GT_TOWN_PATIENCE`` (seconds), else ``DEFAULT_SESSION_PATIENCE_S`` inside a polecat session, else 0.

    Raises:
        ValueError: it is not a number of seconds (0 or more).
    """
    env = os.environ if env is None else env
    text = env.get(PATIENCE_ENV, "").strip()
    if not text:
        return DEFAULT_SESSION_PATIENCE_S if env.get("GT_SESSION") else 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ValueError(f"{PATIENCE_ENV} must be a number of seconds (0 or more), got {text!r}")
    return value


class TownWait:
    """One call's wait for the town: its patience, and the lines it says about waiting (on stderr)."""

    def __init__(self, patience_s: float) -> None:
        self.patience_s = patience_s
        self._since: float | None = None

    def waiting(self, reason: str) -> None:
        """The town does not answer (``reason``), and the call tries again: said once per wait."""
        if self._since is not None:
            return
        self._since = time.monotonic()
        print(
            f"gt: the town does not answer ({reason}); waiting up to {self.patience_s:g} s for it ({PATIENCE_ENV})",
            file=sys.stderr,
            flush=True,
        )

    def answered(self) -> None:
        """The call got through: said when it had waited."""
        if self._since is None:
            return
        print(
            f"gt: the town answers again after {time.monotonic() - self._since:.0f} s; going on",
            file=sys.stderr,
            flush=True,
        )
        self._since = None

    def gave_up(self) -> str | None:
        """What to add to the error of a call that waited in vain (None when it did not wait)."""
        if self._since is None:
            return None
        return (
            f"waited {time.monotonic() - self._since:.0f} s for the town ({PATIENCE_ENV}={self.patience_s:g}); the "
            "same command is safe to run again once it is up"
        )


_CURRENT: contextvars.ContextVar[TownWait | None] = contextvars.ContextVar("gt_town_wait", default=None)


def begin(patience_s: float) -> TownWait:
    """This call's wait (a client helper's worker runs one call after another: each begins its own)."""
    wait = TownWait(patience_s)
    _CURRENT.set(wait)
    return wait


def current() -> TownWait:
    """This call's wait; a call that began none waits for nothing."""
    return _CURRENT.get() or TownWait(0.0)
