"""The ``gt-agent`` executable: the start of the reference agent (``gt.agent``), with only the standard library.

Every session of the reference agent pays for this start-up, and an agent told to hang at once (the benchmarks'
idle sessions, a stall test) needs nothing more: it checks its environment, says which session it is and hangs,
without importing the agent's work (subprocess, JSON, msgspec, the formula code). Any other goes on in
``gt.agent.run``. Fault injection (``GT_AGENT_FAULT``) is read here; see ``gt.agent`` for what each fault does.
"""

from __future__ import annotations

import os
import sys

# Nothing more: `re` and `typing` would cost 10 ms of the 13 ms this start takes (for every session).
from shared.host.privacy import private_files

KINDS = frozenset(
    {
        "crash-at-step",
        "crash-before-commit",
        "hang",
        "exit-before-done",
        "crash-after-done-intent",
        "dirty",
        "conflict",
        "fail-tests",
    }
)
NEEDS_STEP = frozenset({"crash-at-step", "crash-before-commit"})
EXIT_USAGE = 2
DEFAULT_TOWN_PATIENCE_S = 3600.0
DEFAULT_COMMAND_TIMEOUT_S = 3600.0


class Fault:
    """One fault to inject: ``kind``, at ``step`` (None: at once), on attempts ``first_attempt`` to
    ``last_attempt`` (None: every later one). A value: equal when its fields are."""

    __slots__ = ("first_attempt", "kind", "last_attempt", "step")

    def __init__(
        self, *, kind: str, step: int | None = None, first_attempt: int = 1, last_attempt: int | None = None
    ) -> None:
        self.kind, self.step, self.first_attempt, self.last_attempt = kind, step, first_attempt, last_attempt

    def _fields(self) -> tuple[str, int | None, int, int | None]:
        return self.kind, self.step, self.first_attempt, self.last_attempt

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fault) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Fault(kind={self.kind!r}, step={self.step!r}, first_attempt={self.first_attempt!r}, "
            f"last_attempt={self.last_attempt!r})"
        )

    def applies(self, attempt: int) -> bool:
        return self.first_attempt <= attempt and (self.last_attempt is None or attempt <= self.last_attempt)


def parse_faults(text: str) -> list[Fault]:
    """``<kind>[=<step>][@<first>[-<last>]]``, comma-separated. Raises ValueError naming the part it cannot read."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        fault = _fault(part)
        if fault is None:
            raise ValueError(f"GT_AGENT_FAULT: cannot read {part!r} (kinds: {', '.join(sorted(KINDS))})")
        if fault.kind in NEEDS_STEP and fault.step is None:
            raise ValueError(f"GT_AGENT_FAULT: {fault.kind} needs a step, like {fault.kind}=2")
        out.append(fault)
    return out


def _fault(part: str) -> Fault | None:
    head, at, attempts = part.partition("@")
    kind, eq, step = head.partition("=")
    first, dash, last = attempts.partition("-")
    numbers = [n for n, given in ((step, eq), (first, at), (last, dash)) if given]
    if kind not in KINDS or not all(n.isascii() and n.isdigit() for n in numbers):
        return None
    lo = int(first) if at else 1
    return Fault(
        kind=kind,
        step=int(step) if eq else None,
        first_attempt=lo,
        last_attempt=int(last) if dash else (lo if at else None),
    )


def active(faults: list[Fault], attempt: int, kind: str, step: int | None = None) -> bool:
    return any(f.kind == kind and f.applies(attempt) and (f.step is None or f.step == step) for f in faults)


def say(text: str) -> None:
    print(f"[gt-agent] {text}", flush=True)


def hang() -> None:
    say("hanging (fault injection): no more heartbeats or steps")
    os.execvp("sleep", ["sleep", "infinity"])  # noqa: S606 (same pid, almost no memory)


def town_patience() -> float:
    """``GT_AGENT_TOWN_PATIENCE``: how long a town that does not answer is waited for (seconds).

    Raises:
        ValueError: it is not a number of seconds.
    """
    return _seconds("GT_AGENT_TOWN_PATIENCE", DEFAULT_TOWN_PATIENCE_S, zero=True)


def command_timeout() -> float:
    """``GT_AGENT_COMMAND_TIMEOUT``: how long a command the agent runs (the rig's tests) may run before it is taken
    for hung and stopped (seconds; ``gt.agent_command``).

    Raises:
        ValueError: it is not a number of seconds above 0.
    """
    return _seconds("GT_AGENT_COMMAND_TIMEOUT", DEFAULT_COMMAND_TIMEOUT_S, zero=False)


def _seconds(name: str, default: float, *, zero: bool) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 if zero else value > 0):  # also NaN
        more = "0 or more" if zero else "more than 0"
        raise ValueError(f"{name} must be a number of seconds ({more}), got {text!r}")
    return value


def begin() -> tuple[list[Fault], float, int] | int:
    """Check the environment, set the umask, say which session this is, and hang when told to at once; the
    faults, the step pause and the attempt to go on with, or the exit code of an agent that cannot start."""
    missing = [k for k in ("GT_SESSION", "GT_BEAD", "GT_WORKTREE") if not os.environ.get(k)]
    if missing:
        print(f"gt-agent: runs inside a polecat session; {', '.join(missing)} not set", file=sys.stderr)
        return EXIT_USAGE
    try:
        private_files()  # its work and notes under GT_HOME (the worktree), like the services'
        faults = parse_faults(os.environ.get("GT_AGENT_FAULT", ""))
        pause = float(os.environ.get("GT_AGENT_STEP_PAUSE", "0") or 0)
        town_patience()  # bad values are said now, not when the town first does not answer or the tests run
        command_timeout()
    except ValueError as exc:
        print(f"gt-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    attempt = int(os.environ.get("GT_ATTEMPT", "1") or 1)
    say(f"session {os.environ['GT_SESSION']} (attempt {attempt}) on bead {os.environ['GT_BEAD']}")
    if active(faults, attempt, "hang", None):
        hang()
    return faults, pause, attempt


def main() -> int:
    begun = begin()
    if isinstance(begun, int):
        return begun
    from gt.agent import run  # only an agent that works imports its work

    return run(*begun)


if __name__ == "__main__":
    sys.exit(main())
