"""The town chaos run's invariants, judged from the log alone. Pure: a list of events in, violations out.

Each violation names what broke, the bead (or other aggregate) and the events involved (sequence and type),
so a failing run says where to look.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec


class Logged(msgspec.Struct, frozen=True, kw_only=True):
    """One event of the log: its stream sequence, type, subject and payload."""

    seq: int
    type: str
    subject: str
    data: dict[str, Any]

    def ref(self) -> str:
        return f"#{self.seq} {self.type}"


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    invariant: str
    subject: str
    """The bead (or convoy, session, merge request, command) it is about."""
    detail: str
    events: list[str] = []

    def __str__(self) -> str:
        refs = f" [{', '.join(self.events[:12])}{', ...' if len(self.events) > 12 else ''}]" if self.events else ""
        return f"{self.invariant}: {self.subject}: {self.detail}{refs}"


BEAD_RANK = {"open": 0, "hooked": 1, "in_progress": 2, "closed": 3}
SESSION_RANK = {
    "session.requested": 0,
    "session.started": 1,
    "session.done_intent": 2,
    "session.warranted": 2,
    "session.ended": 3,
    "session.cleaned": 4,
}
"""A session's life in the order it allows; one of a lower rank after a higher one is backward. An escalation or a
hook recovery is a note about a session (the deacon writes them after it ended), not a step of its life."""
MR_FINAL = ("mr.merged", "mr.rejected")


def check_all(
    log: list[Logged], beads: Iterable[str], convoys: Iterable[str], commands: Iterable[str]
) -> list[Violation]:
    """Every invariant over the whole log: ``beads``, ``convoys`` and ``commands`` are what the run created or sent."""
    return [
        *beads_closed_once(log, beads),
        *no_backward_bead_transition(log),
        *steps_done_once(log, beads),
        *steps_settled_in_order(log),
        *sessions_forward_and_single(log),
        *merge_requests_settled_once(log, beads),
        *convoys_closed_once(log, convoys),
        *one_outcome_per_command(log, commands),
        *lease_tokens_increase(log),
        *gate_jobs_answered_once(log),
    ]


def _bead_of(event: Logged) -> str | None:
    bead = event.data.get("bead_id")
    return str(bead) if bead is not None else None


def beads_closed_once(log: list[Logged], beads: Iterable[str]) -> list[Violation]:
    closes: dict[str, list[Logged]] = defaultdict(list)
    for event in log:
        if event.type == "bead.closed":
            closes[str(event.data["bead_id"])].append(event)
    out = []
    for bead in beads:
        found = closes.get(bead, [])
        if not found:
            history = [e.ref() for e in log if _bead_of(e) == bead or e.data.get("bead") == bead]
            out.append(Violation(invariant="bead lost", subject=bead, detail="never closed", events=history[-12:]))
        elif len(found) > 1:
            refs = [e.ref() for e in found]
            out.append(
                Violation(invariant="bead closed twice", subject=bead, detail=f"{len(found)} closes", events=refs)
            )
    return out


def no_backward_bead_transition(log: list[Logged]) -> list[Violation]:
    """A bead's status only moves forward: open, hooked, in progress, closed. A re-sling keeps the status; an
    unsling (an operator's) gives a hooked bead back to open, or a held one its hold; nothing but an update
    follows a close; nothing comes before the bead's creation."""
    status: dict[str, str] = {}
    held: set[str] = set()
    out = []
    for event in log:
        if not event.type.startswith("bead."):
            continue
        bead = str(event.data["bead_id"])
        before = status.get(bead)
        if event.type == "bead.created":
            if before is not None:
                out.append(_backward(bead, f"created again while {before}", event))
            status[bead] = "open"
            continue
        if before is None:
            out.append(_backward(bead, "an event before its creation", event))
            continue
        if before == "closed" and event.type != "bead.updated":
            out.append(_backward(bead, "changed after it was closed", event))
            continue
        if event.type == "bead.held":
            held.add(bead)
        if event.type == "bead.unslung":
            # An operator giving the hook back (`gt unsling`): the one way back to open, from a hook only (or a
            # held bead's hold, which leaves it open).
            if before not in ("hooked", "in_progress") and not (before == "open" and bead in held):
                out.append(_backward(bead, f"unslung while {before}", event))
            status[bead] = "open"
            held.discard(bead)
            continue
        if event.type in ("bead.slung", "bead.claimed", "bead.closed"):
            held.discard(bead)
        after = {
            "bead.slung": "hooked" if before == "open" else before,
            "bead.claimed": "in_progress",
            "bead.closed": "closed",
        }.get(event.type, before)
        if BEAD_RANK[after] < BEAD_RANK[before]:
            out.append(_backward(bead, f"{before} -> {after}", event))
        status[bead] = after
    return out


def _backward(subject: str, detail: str, event: Logged) -> Violation:
    return Violation(invariant="backward transition", subject=subject, detail=detail, events=[event.ref()])


def steps_done_once(log: list[Logged], beads: Iterable[str]) -> list[Violation]:
    """Every step of every bead's molecule done exactly once; none started again once done; the molecule
    completed once, after its last step."""
    steps: dict[str, list[str]] = {}
    done: dict[tuple[str, str], list[Logged]] = defaultdict(list)
    completed: dict[str, list[Logged]] = defaultdict(list)
    out = []
    for event in log:
        if event.type == "molecule.attached":
            steps[str(event.data["bead_id"])] = [str(s["id"]) for s in event.data.get("steps", [])]
        elif event.type == "step.done":
            done[(str(event.data["bead_id"]), str(event.data["step"]))].append(event)
        elif event.type == "step.started":
            key = (str(event.data["bead_id"]), str(event.data["step"]))
            if done.get(key):
                out.append(
                    Violation(
                        invariant="done step redone",
                        subject=key[0],
                        detail=f"step {key[1]} started again after it was done",
                        events=[done[key][0].ref(), event.ref()],
                    )
                )
        elif event.type == "molecule.completed":
            completed[str(event.data["bead_id"])].append(event)
    for (bead, step), found in done.items():
        if len(found) > 1:
            out.append(
                Violation(
                    invariant="done step redone",
                    subject=bead,
                    detail=f"step {step} done {len(found)} times",
                    events=[e.ref() for e in found],
                )
            )
    for bead in beads:
        missing = [s for s in steps.get(bead, []) if not done.get((bead, s))]
        if bead not in steps:
            out.append(Violation(invariant="step missing", subject=bead, detail="no molecule was attached"))
        elif missing:
            out.append(Violation(invariant="step missing", subject=bead, detail=f"steps never done: {missing}"))
        if len(completed.get(bead, [])) != 1:
            refs = [e.ref() for e in completed.get(bead, [])]
            n = len(refs)
            out.append(
                Violation(invariant="molecule completion", subject=bead, detail=f"completed {n} times", events=refs)
            )
    return out


STEP_COMMANDS = ("step.start", "step.done")
OUT_OF_ORDER = " done first"
"""How the mayor words the refusal of a step whose needs are not done (services/mayor/decide/work.py)."""


def steps_settled_in_order(log: list[Logged]) -> list[Violation]:
    """Agents send a molecule's step commands in order, each once the previous one is stored, so a step refused
    because an earlier one is not done means a later command overtook an earlier one on its way to the mayor."""
    return [
        Violation(
            invariant="step command overtaken",
            subject=str(event.data.get("command_id")),
            detail=f"{event.data.get('command')} refused: {event.data.get('message')}",
            events=[event.ref()],
        )
        for event in log
        if event.type == "cmd.rejected"
        and event.data.get("command") in STEP_COMMANDS
        and OUT_OF_ORDER in str(event.data.get("message", ""))
    ]


def sessions_forward_and_single(log: list[Logged]) -> list[Violation]:
    """A session's events only move forward, and no bead ever has two live sessions (from ``session.requested``
    until ``session.ended``)."""
    bead_of: dict[str, str] = {}
    rank: dict[str, tuple[int, Logged]] = {}
    live: dict[str, dict[str, Logged]] = defaultdict(dict)
    out = []
    for event in log:
        if not event.type.startswith("session."):
            continue
        session = str(event.data["session_id"])
        if event.type == "session.requested":
            bead = str(event.data["bead"])
            bead_of[session] = bead
            others = live[bead]
            if others:
                refs = [e.ref() for e in others.values()] + [event.ref()]
                detail = f"{session} requested while {sorted(others)} alive"
                out.append(Violation(invariant="two live sessions", subject=bead, detail=detail, events=refs))
            others[session] = event
        elif event.type == "session.ended":
            live[bead_of.get(session, "")].pop(session, None)
        if event.type not in SESSION_RANK:
            continue
        new = SESSION_RANK[event.type]
        before = rank.get(session)
        if before is not None and new < before[0]:
            subject = bead_of.get(session, session)
            detail = f"session {session}: {event.type} after {before[1].type}"
            out.append(
                Violation(
                    invariant="backward transition",
                    subject=subject,
                    detail=detail,
                    events=[before[1].ref(), event.ref()],
                )
            )
        if before is None or new >= before[0]:
            rank[session] = (new, event)
    return out


def merge_requests_settled_once(log: list[Logged], beads: Iterable[str]) -> list[Violation]:
    """Every bead's change recorded merged, and pushed at most once (one ``mr.merged`` not marked ``already``;
    a refinery killed after its push records the merge ``already`` done when it comes back); nothing follows a
    merge request's final event."""
    bead_of: dict[str, str] = {}
    final: dict[str, Logged] = {}
    merged: dict[str, list[Logged]] = defaultdict(list)
    out = []
    for event in log:
        if not event.type.startswith("mr."):
            continue
        mr = str(event.data["mr_id"])
        if event.type == "mr.submitted":
            bead_of[mr] = str(event.data["bead"])
        if mr in final:
            detail = f"merge request {mr}: {event.type} after {final[mr].type}"
            subject = bead_of.get(mr, mr)
            out.append(
                Violation(
                    invariant="backward transition",
                    subject=subject,
                    detail=detail,
                    events=[final[mr].ref(), event.ref()],
                )
            )
            continue
        if event.type in MR_FINAL:
            final[mr] = event
        if event.type == "mr.merged":
            merged[bead_of.get(mr, mr)].append(event)
    for bead in beads:
        found = merged.get(bead, [])
        pushed = [e for e in found if not e.data.get("already")]
        if not found or len(pushed) > 1:
            out.append(
                Violation(
                    invariant="merged once",
                    subject=bead,
                    detail=f"merged {len(found)} times, pushed {len(pushed)} times",
                    events=[e.ref() for e in found],
                )
            )
    return out


def convoys_closed_once(log: list[Logged], convoys: Iterable[str]) -> list[Violation]:
    closed: dict[str, list[Logged]] = defaultdict(list)
    out = []
    for event in log:
        if not event.type.startswith("convoy."):
            continue
        convoy = str(event.data["convoy_id"])
        if closed.get(convoy):
            detail = f"{event.type} after it was closed"
            out.append(
                Violation(
                    invariant="convoy closed once",
                    subject=convoy,
                    detail=detail,
                    events=[closed[convoy][0].ref(), event.ref()],
                )
            )
        if event.type == "convoy.closed":
            closed[convoy].append(event)
    for convoy in convoys:
        if not closed.get(convoy):
            out.append(Violation(invariant="convoy closed once", subject=convoy, detail="never closed"))
    return out


def one_outcome_per_command(log: list[Logged], commands: Iterable[str]) -> list[Violation]:
    """Every command in the log has exactly one outcome, and every command the run sent has one."""
    found: Counter[str] = Counter()
    refs: dict[str, list[str]] = defaultdict(list)
    for event in log:
        if event.type in ("cmd.accepted", "cmd.rejected"):
            command = str(event.data["command_id"])
            found[command] += 1
            refs[command].append(event.ref())
    out = [
        Violation(invariant="one outcome per command", subject=cmd, detail=f"{n} outcomes", events=refs[cmd])
        for cmd, n in found.items()
        if n > 1
    ]
    out += [
        Violation(invariant="one outcome per command", subject=cmd, detail="no outcome")
        for cmd in commands
        if not found.get(cmd)
    ]
    return out


def lease_tokens_increase(log: list[Logged]) -> list[Violation]:
    """A lease's fencing token never goes down: each acquisition gets a larger one than the last."""
    last: dict[str, Logged] = {}
    out = []
    for event in log:
        if event.type != "lease.acquired":
            continue
        lease = str(event.data["lease"])
        before = last.get(lease)
        if before is not None and int(event.data["token"]) <= int(before.data["token"]):
            detail = f"token {event.data['token']} after {before.data['token']}"
            out.append(
                Violation(
                    invariant="backward transition", subject=lease, detail=detail, events=[before.ref(), event.ref()]
                )
            )
        last[lease] = event
    return out


def gate_jobs_answered_once(log: list[Logged]) -> list[Violation]:
    """A gate job (``GT_MQ_RUNNERS``) is taken once per attempt, attempts counting up by one; it is answered
    (finished or cancelled) at most once, and nothing of a runner follows its answer; a finished job is answered by
    the runner that took it last, at that attempt."""
    out = []
    by_job: dict[str, list[Logged]] = defaultdict(list)
    for event in log:
        if event.type.startswith("gate."):
            by_job[str(event.data.get("job_id"))].append(event)
    for job, events in sorted(by_job.items()):
        refs = [e.ref() for e in events]
        starts = [e for e in events if e.type == "gate.started"]
        if [e.data.get("attempt") for e in starts] != list(range(1, len(starts) + 1)):
            out.append(Violation(invariant="gate job taken out of turn", subject=job, detail="attempts", events=refs))
        answers = [i for i, e in enumerate(events) if e.type in ("gate.finished", "gate.cancelled")]
        if len(answers) > 1:
            out.append(Violation(invariant="gate job answered twice", subject=job, detail="answers", events=refs))
        if answers and any(e.type != "gate.requested" for e in events[answers[0] + 1 :]):
            out.append(Violation(invariant="gate job moved after its answer", subject=job, detail="", events=refs))
        finished = [e for e in events if e.type == "gate.finished"]
        if finished and starts:
            last = starts[-1].data
            took = (last.get("runner"), last.get("attempt"))
            if (finished[0].data.get("runner"), finished[0].data.get("attempt")) != took:
                detail = f"finished by {finished[0].data.get('runner')}, taken last by {took[0]}"
                out.append(Violation(invariant="gate job answered by a runner that lost it", subject=job,
                                     detail=detail, events=refs))  # fmt: skip
    return out
