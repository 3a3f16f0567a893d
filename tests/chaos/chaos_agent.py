"""The town chaos run's agent: ``gt-agent`` with faults drawn per bead and attempt at configured rates.

Run as a script in each polecat's worktree (``python /path/to/chaos_agent.py``; standard library only, so it
needs no import path): it draws this session's faults from ``GT_AGENT_CHAOS_SEED``, the bead and the attempt,
then replaces itself with ``gt-agent`` (``GT_AGENT_CHAOS_AGENT``) with ``GT_AGENT_FAULT`` set. The draw is
deterministic, so the run's report can say which bead got which fault. Only the first ``FAULTY_ATTEMPTS``
attempts of a bead can be faulty: every bead can finish.

``GT_AGENT_CHAOS_RATES`` (comma-separated ``<kind>=<probability>``, kinds below) gives each kind's chance per
attempt; they must add up to at most 1.
"""

from __future__ import annotations

import os
import random
import sys

FAULTY_ATTEMPTS = 2
STEPS = 6
"""Steps of the polecat-work formula the agent follows."""
KINDS = ("crash", "hang", "dirty", "fail-tests")
DEFAULT_RATES = {"crash": 0.15, "hang": 0.05, "dirty": 0.1, "fail-tests": 0.05}


def parse_rates(text: str) -> dict[str, float]:
    """Raises ValueError naming what it cannot read."""
    rates: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, sep, value = part.partition("=")
        if not sep or kind not in KINDS:
            raise ValueError(f"chaos rates: cannot read {part!r} (kinds: {', '.join(KINDS)}; like crash=0.1)")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"chaos rates: {kind} needs a number between 0 and 1, not {value!r}") from None
        if not 0 <= rate <= 1:
            raise ValueError(f"chaos rates: {kind}={rate} is not between 0 and 1")
        rates[kind] = rate
    if sum(rates.values()) > 1:
        raise ValueError(f"chaos rates: they add up to {sum(rates.values()):g}, more than 1")
    return rates


def faults_for(seed: int, bead: str, attempt: int, rates: dict[str, float]) -> str:
    """The ``GT_AGENT_FAULT`` value of one session ("" for a clean one). Pure: the same arguments, the same draw."""
    if attempt > FAULTY_ATTEMPTS:
        return ""
    rng = random.Random(f"{seed}:{bead}:{attempt}")
    draw = rng.random()
    step = rng.randint(1, STEPS)
    cut = 0.0
    for kind in KINDS:
        cut += rates.get(kind, 0.0)
        if draw < cut:
            return _fault(kind, step, attempt, rng)
    return ""


def _fault(kind: str, step: int, attempt: int, rng: random.Random) -> str:
    on = f"@{attempt}"
    if kind == "crash":
        # Killed mid-step, or right after recording its done-intent (the window inside `gt done`).
        return f"crash-after-done-intent{on}" if rng.random() < 0.2 else f"crash-at-step={step}{on}"
    if kind == "hang":
        return f"hang={step}{on}"
    if kind == "dirty":
        # Dies with an edit not committed, or finishes with an uncommitted file (`gt done` refuses).
        return f"crash-before-commit={step}{on}" if rng.random() < 0.5 else f"dirty{on}"
    return f"fail-tests{on}"


def main() -> int:
    try:
        rates = parse_rates(os.environ.get("GT_AGENT_CHAOS_RATES", ""))
        seed = int(os.environ.get("GT_AGENT_CHAOS_SEED", "0"))
        attempt = int(os.environ.get("GT_ATTEMPT", "1") or 1)
    except ValueError as exc:
        print(f"chaos_agent: {exc}", file=sys.stderr)
        return 2
    agent = os.environ.get("GT_AGENT_CHAOS_AGENT", "gt-agent")
    fault = faults_for(seed, os.environ.get("GT_BEAD", ""), attempt, rates)
    env = {**os.environ, "GT_AGENT_FAULT": fault}
    print(f"chaos_agent: attempt {attempt}, faults {fault or 'none'}", flush=True)
    os.execvpe(agent, [agent, *sys.argv[1:]], env)  # the agent itself, with this pid
    return 127  # not reached: execvpe replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
