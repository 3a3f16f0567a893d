"""What ``gt prime`` tells a polecat session, as one document: ``gt prime --json`` prints it, its text view is
made from it, the Stop hook reads it, and the reference agent (``gt.agent``) reads it back into this class. Pure
data, built from the witness's session and the mayor's bead, molecule and mail as of one moment of the log."""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

import msgspec

from shared.core.errors import QueryError
from shared.core.terminal import escape_line, escape_text, escaped_lines
from shared.model import gates as step_gates
from shared.model.beads import Bead, BeadDetail
from shared.model.commands.mail import polecat_address
from shared.model.events.sessions import SessionStatus
from shared.model.formulas import rework
from shared.model.molecules import MoleculeView, Step
from shared.model.queries import Query, mayor, witness
from shared.model.rigs import Rig
from shared.model.sessions import EarlierSession, MergeFailure

R = TypeVar("R")


class Prime(msgspec.Struct, kw_only=True, gc=False):
    session: str
    status: SessionStatus
    attempt: int
    polecat: str
    rig: Rig | None
    """The rig's settings (its gates, its base branch); None when the witness no longer knows the rig."""
    worktree: str
    branch: str
    bead: BeadDetail
    molecule: MoleculeView | None
    """None: the bead has no molecule, and is worked as one step."""
    current_step: Step | None
    """The molecule's step to work now; None when every one is done (or there is no molecule)."""
    done_intent: bool
    """`gt done` already began for this session."""
    merge_failure: MergeFailure | None
    """Why the merge queue last sent the bead's work back."""
    nudges: list[str]
    """What was nudged to this session."""
    before_you: list[EarlierSession]
    """How the bead's earlier sessions ended, newest first."""
    mail: list[Bead]
    """Unread messages to the polecat."""
    instructions: str


NOTE_SHOWN = 1500
"""Characters of a predecessor's handoff note (or end detail) that `gt prime` shows."""
INSTRUCTIONS = (
    "Work the current step in your worktree. When a step is finished, commit and run `gt step done <step>`: "
    "done steps are never redone, so a fresh session after a crash resumes at the first step not done. "
    "Commit early (uncommitted work survives in the worktree, but only commits are pushed). Run "
    "`gt heartbeat` every few minutes while a step takes long, or the witness takes you for stalled. "
    "When every step is done, run `gt done`: it pushes your branch and submits it to the merge queue. "
    "If your context is full, run `gt handoff --note TEXT`: a fresh session continues on the same hook, and its "
    "`gt prime` shows your note. Mail for you is listed here and announced in your pane: `gt mail inbox`, "
    "`gt mail read ID`, `gt mail reply ID --body TEXT`."
)


def _ended_how(earlier: EarlierSession) -> str:
    """One line on how an earlier session ended, from the witness's record of it."""
    reason, detail = earlier.end_reason, escape_line(earlier.end_detail)
    if earlier.warrant_reason:
        how = f"warranted ({escape_line(earlier.warrant_reason)})"
        if earlier.warrant_detail:
            how += f": {escape_line(earlier.warrant_detail)}"
        if reason and reason != earlier.warrant_reason:
            how += f"; ended {reason}"
        return how
    if reason == "handoff":
        return f"handed off; its note: {detail[:NOTE_SHOWN]}" if detail else "handed off (no note)"
    if reason == "done":
        return "finished (`gt done`)" + (f": {detail}" if detail else "")
    if reason is None:
        return f"still {escape_line(earlier.status)}"
    return f"ended ({escape_line(reason)})" + (f": {detail[:NOTE_SHOWN]}" if detail else "")


def before_you_lines(earlier_sessions: list[EarlierSession]) -> list[str]:
    """The "Before you" section: how the bead's earlier sessions ended, newest first."""
    if not earlier_sessions:
        return []
    lines = ["", "Before you (earlier sessions on this bead, newest first):"]
    for earlier in earlier_sessions:
        lines.append(f"- {escape_line(earlier.id)} (attempt {earlier.attempt}): {_ended_how(earlier)}")
        if earlier.pane_tail:
            lines.append("  last lines of its pane:")
            lines += [f"  | {line}" for line in escaped_lines(earlier.pane_tail) if line]
    return lines


def mail_lines(messages: list[Bead]) -> list[str]:
    if not messages:
        return []
    lines = ["", f"Mail ({len(messages)} unread): read one with `gt mail read ID`, answer with `gt mail reply ID`"]
    for message in messages:
        sender = escape_line(message.metadata.get("from", "-"))
        lines.append(f"- {escape_line(message.id)} from {sender}: {escape_line(message.title)}")
    return lines


GATE_WAIT = (
    "Nothing to do on this step until its gate opens: stop here and end your turn (do not mark it done: that is "
    "refused). The witness ends this session once it is quiet and starts a fresh one on the same hook when the gate "
    "opens; commit what you have first."
)


def prime_text(data: Prime) -> str:
    """What `gt prime` tells the agent. What other agents wrote (the bead's title and description, its steps, a
    predecessor's note, mail) is shown with its control characters escaped, a field of one line on one line: no
    text of theirs ends a line early to start one that reads as the town's."""
    bead, molecule, rig = data.bead, data.molecule, data.rig
    e = escape_line
    lines = [
        f"# gastown: you are polecat {e(data.polecat)} of rig {e(rig.name if rig else None)} "
        f"(session {e(data.session)}, attempt {data.attempt})",
        "",
        f"Hook: bead {e(bead.id)} [{e(bead.status)}]: {e(bead.title)}",
    ]
    failure, step = data.merge_failure, data.current_step
    # Work sent back leads while its rework steps are current: what conflicted (or failed) and what to do first.
    reworking = failure is not None and step is not None and rework.is_rework(step.id)
    if failure is not None and step is not None and reworking:
        lines += ["", send_back_text(failure, data.branch, step.id)]
    if bead.description:
        lines += ["", escape_text(bead.description)]
    if molecule is not None:
        lines += ["", f"Molecule {e(molecule.formula)}: {molecule.done}/{molecule.total} steps done"]
        for listed in molecule.steps:
            mark = ">" if listed.id == molecule.current_step else " "
            lines.append(f" {mark} [{e(listed.status):<11}] {e(listed.id)}: {e(listed.title)}")
        if step is not None:
            lines += ["", f"Current step: {e(step.id)}: {e(step.title)}"]
            if step.description:
                lines.append(escape_text(step.description))
            if step.acceptance:
                lines.append(f"Acceptance: {escape_text(step.acceptance)}")
            if (gate := step_gates.step_gate_text(bead.id, step)) is not None:
                lines.append(escape_line(gate))  # one line: a note or a check's output never reads as the town's
                if step.gate_closed():
                    lines.append(GATE_WAIT)
        else:
            lines += ["", "Every step is done: run `gt done`."]
    branch = f"Branch:   {e(data.branch)} (base {e(rig.base_branch if rig else None)})"
    lines += ["", f"Worktree: {e(data.worktree)}", branch]
    if rig is not None:
        named = (("setup", rig.setup_command), ("lint", rig.lint_command), ("test", rig.test_command))
        gates = [f"{name} `{command}`" for name, command in named if command]
        if gates:
            lines.append(f"Gates:    {', '.join(gates)}")
    if failure is not None and not reworking:
        lines += ["", send_back_text(failure, data.branch)]
    if data.done_intent:
        lines.append("`gt done` already began for this session: run it again to finish it.")
    lines += before_you_lines(data.before_you)
    lines += mail_lines(data.mail)
    lines += ["", data.instructions]
    return "\n".join(lines)


def send_back_text(failure: MergeFailure, branch: str, rework_step: str | None = None) -> str:
    """Why the merge queue sent the work back, and what to do: the rework steps when ``rework_step`` (the current
    one) says the molecule has them, else (a bead without a molecule) fix it and `gt done` again."""
    finish = (
        f", marking each rework step done as you go (now: `{rework_step}`), then run `gt done` again."
        if rework_step is not None
        else " and run `gt done` again."
    )
    if failure.gate == "conflict":
        return conflict_text(failure, branch, finish)
    return (
        f"The merge queue sent this work back: the {failure.gate} gate failed (exit {failure.exit_code}) "
        f"on merge request {failure.mr}. Fix it, commit, run the tests{finish} Last output:\n"
        + escape_text(failure.tail[-1500:])
    )


def conflict_text(failure: MergeFailure, branch: str, finish: str = " and run `gt done` again.") -> str:
    target = failure.target_commit or "the target"
    files = ", ".join(failure.files) or "files git did not name"
    return (
        f"The merge queue sent this work back: merge request {failure.mr} conflicted with the target at "
        f"{target} in {files}. Rebase your branch onto it (`git fetch origin && git rebase {target}`) and "
        f"resolve the conflicts. {rework.RESOLVE}. Run the tests, push the rebased branch (`git push "
        f"--force-with-lease origin {branch}`){finish}"
    )


class Reader(Protocol):
    """Asks a query, answered as of one moment of the log (the caller's ``min_seq``), read into its reply type."""

    async def __call__(self, query: Query[R], /) -> R: ...


async def read_prime(read: Reader, session_id: str) -> Prime:
    """The session's ``Prime``: the witness's session first (it names the bead and the polecat), then the mayor's
    bead, molecule and mail at once. ``read`` does the asking (`gt prime` as the session, the witness as itself)."""
    session = await read(witness.Session(id=session_id))

    async def molecule_of(bead: str) -> MoleculeView | None:
        try:
            return await read(mayor.Molecule(bead=bead))
        except QueryError as exc:  # a bead without a molecule is worked as one step
            if exc.code != "not_found":
                raise
            return None

    bead, molecule, mail = await asyncio.gather(
        read(mayor.Get(id=session.bead)),
        molecule_of(session.bead),
        read(mayor.Inbox(to=polecat_address(session.rig, session.polecat))),
    )
    current = None
    if molecule is not None:
        current = next((s for s in molecule.steps if s.id == molecule.current_step), None)
    return Prime(
        session=session.id,
        status=session.status,
        attempt=session.attempt,
        polecat=session.polecat,
        rig=session.rig_config,
        worktree=session.worktree,
        branch=session.branch,
        bead=bead,
        molecule=molecule,
        current_step=current,
        done_intent=session.done_intent_at is not None,
        merge_failure=session.merge_failure,
        nudges=[n.message for n in session.nudges if n.delivered_to == session.id],
        before_you=session.earlier_sessions,
        mail=mail,
        instructions=INSTRUCTIONS,
    )
