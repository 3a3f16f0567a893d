"""``gt-agent``: the reference scripted agent, for demos, tests and benchmarks.

It uses only the ``gt`` CLI and git inside its session, like any agent would: ``gt prime --json`` to learn
its hook, then for each step not yet done a deterministic edit (one file per step), a commit and ``gt step
done``; at a step whose id mentions "test" it runs the rig's test command, heartbeating while it runs
(``gt.agent_command``); finally ``gt done``. A fresh
session after a crash resumes at the first step not done, and uncommitted work it finds is committed.

It commits only the files it writes (named paths, never ``git add -A``); common build output (Python bytecode,
test and type-checker caches, ``node_modules``: ``shared.host.git.BUILD_OUTPUT``) is kept out of ``git status`` by the
clone's ``info/exclude``, which the witness writes for every runtime, so a project without a ``.gitignore`` for
it gets no ``__pycache__`` merged and ``gt done`` finds the worktree clean. Work the merge queue sends back comes
with rework steps appended to the molecule (``shared.model.formulas.rework``); at the round's first step it fixes a
failed gate it caused (``FAIL_TESTS``), or resolves a merge conflict by rebasing onto the target commit, keeping
what landed in each conflicting hunk and re-applying the rest of its change (``resolve_conflict``), and
force-pushing the branch; it writes no step file for rework steps (their
work is the fix: work it cannot fix is submitted again unchanged), runs the tests at ``run-tests`` and then
``gt done``. Done steps are never worked again.

Failure injection (``GT_AGENT_FAULT``, comma-separated, each ``<fault>[=<step>][@<attempts>]`` where
attempts is ``N`` or ``N-M`` and defaults to every attempt):

- ``crash-at-step=K``: SIGKILL itself after committing step K, before ``gt step done``
- ``crash-before-commit=K``: SIGKILL itself after editing step K, leaving the worktree dirty
- ``hang`` / ``hang=K``: stop (at once, or at step K) and sleep forever, no heartbeats
- ``exit-before-done``: exit after the last step without ``gt done``
- ``crash-after-done-intent``: SIGKILL itself once ``gt done`` has recorded the done-intent
- ``dirty``: leave an uncommitted file behind (``gt done`` then refuses; the next session commits it)
- ``conflict``: also write ``CONFLICT.txt``, which every bead writes differently (a merge conflict)
- ``fail-tests``: create ``FAIL_TESTS`` at the top of the worktree (a rig test like ``test ! -e FAIL_TESTS``
  fails) and submit anyway

At a step whose gate is closed (a formula's ``wait``: ``shared.model.gates``) it stops and exits 0: nothing is to be
done until the gate opens, when the witness starts a fresh session.

``GT_AGENT_STEP_PAUSE`` (seconds) slows each step down, for demos and external kill tests.

A town that does not answer (NATS unreachable, or the service that answers is not running, as during ``gt down``
and ``gt up``, or a NATS restart) is waited out by ``gt`` itself, as for every agent (gt/cli/patience.py), here
for up to ``GT_AGENT_TOWN_PATIENCE`` seconds (default 3600) instead of the sessions' default, what it says about
it shown in the pane, so the session goes on with its work once the town is back instead of giving up on it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from gt import agent_command, agent_start
from gt.agent_start import Fault, active, hang, say, town_patience
from gt.cli.patience import PATIENCE_ENV
from shared.model.formulas import rework
from shared.model.molecules import Step
from shared.model.prime import Prime
from shared.model.rigs import Rig
from shared.model.sessions import MergeFailure

EXIT_UNREACHABLE = 3
"""``gt``'s exit code for a town that does not answer (gt/cli/main.py)."""
WAIT_LINES = ("gt: the town does not answer", "gt: the town answers again")
"""What ``gt`` says on stderr about waiting for the town (gt/cli/patience.py), shown in the pane."""
WORK_DIR = ".gastown-work"
KEEP_WHAT_LANDED = ("-X", "ours")
"""The rebase's resolution of a conflicting hunk: the side of the commit rebased onto (in a rebase "ours" is what
landed, "theirs" the commit replayed). Never both sides: two versions of one line kept together contradict."""


def die_hard() -> None:
    say("crashing (fault injection: SIGKILL)")
    os.kill(os.getpid(), signal.SIGKILL)


def gt(*args: str, check: bool = True, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``gt``. A town that does not answer is waited out by ``gt`` itself (gt/cli/patience.py), for this
    agent's ``GT_AGENT_TOWN_PATIENCE`` (an hour: it has no tool timeout to stay under), as every agent's calls are
    for theirs; what it says about waiting (``gt: the town does not answer ...``, ``... answers again ...``) is
    shown in the pane as it comes. A call that still ends unreachable (exit 3: a service too slow to answer while
    it catches up, JetStream not answering yet) is run again, once a second, within the same patience: every
    command the agent sends is safe to send again (a step done twice is unchanged, ``gt done`` picks up where it
    stopped)."""
    give_up_at = time.monotonic() + town_patience()
    told = False
    while True:
        left = max(0.0, give_up_at - time.monotonic())
        done = _gt_once(args, {**os.environ, **(extra_env or {}), PATIENCE_ENV: f"{left:g}"})
        if done.returncode != EXIT_UNREACHABLE or time.monotonic() >= give_up_at:
            break
        if not told:
            told = True
            why = (done.stderr.strip() or done.stdout.strip() or "exit 3").splitlines()[-1]
            say(f"gt {args[0]} did not get through ({why}); trying again until it does")
        time.sleep(min(1.0, max(0.0, give_up_at - time.monotonic())))
    if check and done.returncode != 0:
        raise RuntimeError(f"gt {' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return done


def _gt_once(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One ``gt`` call; what it says about waiting for the town is shown in the pane as it comes."""
    proc = subprocess.Popen(["gt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None
    assert stderr is not None
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
    reader.start()
    err: list[str] = []
    for line in stderr:
        err.append(line)
        if line.startswith(WAIT_LINES):
            say(line.removeprefix("gt: ").rstrip())
    proc.wait()
    reader.join()
    return subprocess.CompletedProcess(["gt", *args], proc.returncode, "".join(out), "".join(err))


def git(*args: str, cwd: Path) -> str:
    # Plain git, as any agent runs it: the witness gives the session its polecat's git identity.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def listen_for_nudges() -> None:
    """Print any line typed into the pane (a nudge) so it shows that the agent read it."""
    if not sys.stdin.isatty():
        return
    while select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            return
        say(f"heard: {line.strip()}")


def prime() -> Prime:
    for attempt in range(5):
        done = gt("prime", "--json", check=False)
        if done.returncode == 0:
            return msgspec.json.decode(done.stdout, type=Prime)
        say(f"gt prime failed ({done.stderr.strip()}); retrying")
        time.sleep(0.5 * (attempt + 1))
    raise RuntimeError("gt prime kept failing")


DIRTY_FILE = "scratch.txt"
"""What the ``dirty`` fault leaves uncommitted: the agent's own file, so the next session commits it."""


def own_paths(bead: str) -> list[str]:
    """Everything this agent ever writes in a worktree: its step files and the files of its faults."""
    return [f"{WORK_DIR}/{bead}", "CONFLICT.txt", "FAIL_TESTS", DIRTY_FILE]


def commit_own(worktree: Path, bead: str, message: str) -> bool:
    """Commit the changes to the paths this agent writes, by name: whatever else is in the worktree (build
    output of the tests, an editor's files) is not its work and is never committed."""
    changed = [p for p in own_paths(bead) if git("status", "--porcelain", "--", p, cwd=worktree).strip()]
    if not changed:
        return False
    git("add", "-A", "--", *changed, cwd=worktree)
    git("commit", "--quiet", "-m", message, cwd=worktree)
    return True


def edit_for(worktree: Path, bead: str, index: int, step: Step) -> None:
    folder = worktree / WORK_DIR / bead
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{index:02d}-{step.id}.txt").write_text(f"step {step.id}: {step.title}\n")


def run_tests(worktree: Path, rig: Rig | None, faults: list[Fault], attempt: int) -> None:
    command = rig.test_command if rig is not None else ""
    if not command:
        say("no test command for this rig")
        return
    # Heartbeating while they run: a suite longer than the rig's stall limit is work, not a stall.
    every_s = agent_command.beat_every(rig.stall_after_s if rig is not None else None)
    code, output = agent_command.run(command, worktree, what="running the tests", every_s=every_s)
    if code == 0:
        say("tests pass")
        return
    if active(faults, attempt, "fail-tests"):
        say("tests fail (fault injection); submitting anyway")
        return
    if (worktree / "FAIL_TESTS").exists():
        # An earlier attempt's injected failure, left behind when that session died before the merge queue
        # could send it back: this agent knows its only cause, so it fixes it as it would a returned one.
        (worktree / "FAIL_TESTS").unlink()  # the step's commit records the removal
        say("fixed: removed the FAIL_TESTS an earlier attempt left")
        run_tests(worktree, rig, faults, attempt)
        return
    raise RuntimeError(f"tests fail ({code}): {output[-500:]}")


def work(data: Prime, faults: list[Fault], attempt: int, pause: float) -> bool:
    """Each step not done, in order; False when it stopped at a step whose gate is closed (nothing to do until it
    opens: the witness starts a fresh session then)."""
    bead = data.bead.id
    worktree = Path(data.worktree)
    if commit_own(worktree, bead, f"{bead}: work an earlier session left uncommitted"):
        say("committed the uncommitted work an earlier session left")
    if data.bead.status == "hooked" and data.rig is not None:
        gt("bead", "claim", bead, "--assignee", f"{data.rig.name}/{data.polecat}", check=False)
    steps = data.molecule.steps if data.molecule is not None else []
    for index, step in enumerate(steps, start=1):
        if step.status == "done":
            continue
        listen_for_nudges()
        if step.gate_closed() and _still_closed(step.id):
            say(f"step {index} {step.id} waits on its gate: nothing to do until it opens; ending this session")
            return False
        if active(faults, attempt, "hang", index):
            hang()
        say(f"step {index} {step.id}: {step.title}")
        reworking = rework.what(step.id)
        if reworking in (rework.REBASE, rework.FIX):
            fix_returned_work(data, faults, attempt)  # the round's first step: what the merge queue sent back
        if reworking is None:
            # A rework step's work is the fix itself: a step file would make a new commit of work left unfixed.
            edit_for(worktree, bead, index, step)
        if active(faults, attempt, "crash-before-commit", index):
            die_hard()
        if "test" in step.id:
            if active(faults, attempt, "fail-tests"):
                (worktree / "FAIL_TESTS").write_text("made to fail by GT_AGENT_FAULT=fail-tests\n")
            run_tests(worktree, data.rig, faults, attempt)
        if active(faults, attempt, "conflict") and reworking is None:
            # The original work only: written again after a rebase, it would drop the other side it now holds.
            (worktree / "CONFLICT.txt").write_text(f"{bead} was here\n")
        commit_own(worktree, bead, f"{bead}: {step.id}")
        if active(faults, attempt, "crash-at-step", index):
            die_hard()
        gt("step", "done", step.id)
        gt("heartbeat", "--note", f"done {step.id}", check=False)
        if pause:
            time.sleep(pause)
    return True


def _still_closed(step_id: str) -> bool:
    """Whether the gate of ``step_id`` is still closed now (what `gt prime` said at the start may be old)."""
    fresh = prime()
    steps = fresh.molecule.steps if fresh.molecule is not None else []
    return any(step.id == step_id and step.gate_closed() for step in steps)


def fix_returned_work(data: Prime, faults: list[Fault], attempt: int) -> None:
    """The merge queue sent the work back: undo what made the gate fail (the only failure this agent makes),
    or resolve the merge conflict."""
    failure = data.merge_failure
    if failure is None:
        return
    worktree = Path(data.worktree)
    if failure.gate == "conflict":
        resolve_conflict(data, failure)
        run_tests(worktree, data.rig, faults, attempt)
        return
    say(f"the merge queue sent this back: {failure.gate} failed (exit {failure.exit_code})")
    if (worktree / "FAIL_TESTS").exists() and not active(faults, attempt, "fail-tests"):
        (worktree / "FAIL_TESTS").unlink()
        commit_own(worktree, data.bead.id, f"{data.bead.id}: fix the {failure.gate} failure")
        say("fixed: removed FAIL_TESTS")
    run_tests(worktree, data.rig, faults, attempt)


def resolve_conflict(data: Prime, failure: MergeFailure) -> None:
    """Rebase the branch onto the commit it conflicted with. This agent cannot understand a conflict, so it does
    the one thing that keeps what landed working: in each conflicting hunk it keeps what landed and drops its own
    side, and the rest of its change (every hunk that does not conflict) is re-applied on top (git's rebase with
    ``-X ours``). It says which files lost its side. Its `gt done` publishes the rebased branch (the merge queue
    takes the commit it names). A conflict that cannot be settled that way (a file deleted on one side) is given
    up on: the session ends without `gt done`, and past the rig's respawn limit the witness escalates the bead
    to a person."""
    worktree, branch, target = Path(data.worktree), data.branch, failure.target_commit
    files = ", ".join(failure.files) or "unknown files"
    say(f"the merge queue sent this back: it conflicts with {target[:10]} in {files}")
    git("fetch", "--quiet", "origin", cwd=worktree)
    try:
        git("rebase", "--quiet", *KEEP_WHAT_LANDED, "--end-of-options", target, cwd=worktree)
    except subprocess.CalledProcessError as exc:
        with contextlib.suppress(subprocess.CalledProcessError):
            git("rebase", "--abort", cwd=worktree)
        raise RuntimeError(f"cannot resolve the conflict with {target[:10]}: {exc.stderr.strip()}") from exc
    say(
        f"resolved: rebased onto {target[:10]}, keeping what landed where this change conflicted with it (in "
        f"{files}) and re-applying the rest; `gt done` publishes {branch} again"
    )


def finish(data: Prime, faults: list[Fault], attempt: int) -> int:
    worktree = Path(data.worktree)
    if active(faults, attempt, "dirty"):
        (worktree / DIRTY_FILE).write_text("left uncommitted (fault injection)\n")
    if active(faults, attempt, "exit-before-done"):
        say("exiting before gt done (fault injection)")
        return 0
    extra = {"GT_CRASH_AT": "gt_done.after_intent"} if active(faults, attempt, "crash-after-done-intent") else None
    done = gt("done", check=False, extra_env=extra)
    if done.returncode == -signal.SIGKILL:
        die_hard()
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        say(f"gt done failed: {done.stderr.strip()}")
        return 1
    say("done")
    return 0


def main() -> int:
    """``python -m gt.agent``: as the ``gt-agent`` executable (``gt.agent_start``)."""
    return agent_start.main()


def run(faults: list[Fault], pause: float, attempt: int) -> int:
    """The agent's work once started (``gt.agent_start.begin``): prime, each step not done, ``gt done``."""
    try:
        data = prime()
        if not work(data, faults, attempt, pause):
            return 0  # at a closed gate: the session ends, its bead stays hooked
        steps = data.molecule.steps if data.molecule is not None else []
        if not any(rework.is_rework(step.id) for step in steps):
            fix_returned_work(data, faults, attempt)  # no molecule to append rework steps to: after its one step
        return finish(data, faults, attempt)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        say(f"giving up: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
