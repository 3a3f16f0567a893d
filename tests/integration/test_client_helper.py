"""The ``gt`` client helper (gt/launch.py, gt/cli/helper.py), as a user's shell meets it: the installed ``gt``
executable against a real NATS server and a mayor process. Each test has its own helper (its own
``XDG_RUNTIME_DIR``) and stops it at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from gt import launch
from gt.cli.common import EXIT_UNREACHABLE
from shared.core.config import TownConfig
from tests.helpers import assert_eventually
from tests.service_process import ServiceProcess

GT = str(Path(sys.executable).parent / "gt")
REPO_ROOT = Path(__file__).parents[2]
BEAD_ID = re.compile(r"hq-[0-9a-z]{6}")


@dataclass
class Run:
    code: int
    out: str
    err: str


class Shell:
    """Runs the installed ``gt`` as a user's shell does, in a working directory of the test's."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd

    async def start(self, *args: str, stdin: bytes | None = None, **env: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            GT,
            *args,
            env={**self.env, **env},
            cwd=self.cwd,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def __call__(self, *args: str, stdin: bytes | None = None, **env: str) -> Run:
        return await finished(await self.start(*args, stdin=stdin, **env), stdin)

    def helpers(self) -> list[psutil.Process]:
        """This test's helper processes: the helper, its spares and the children running calls."""
        runtime = self.env["XDG_RUNTIME_DIR"]
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if "gt.cli.helper" in cmdline and any(arg.startswith(runtime) for arg in cmdline):
                found.append(proc)
        return found

    def helper(self) -> psutil.Process | None:
        """The helper itself, as its lock file names it (not its spares or children)."""
        for lock in (Path(self.env["XDG_RUNTIME_DIR"]) / "gt").glob("helper-*.sock.lock"):
            text = lock.read_text().strip()
            if not text:
                continue
            try:
                proc = psutil.Process(int(text))
                if "gt.cli.helper" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
            except psutil.Error:
                continue
        return None

    def call_running_in(self, cwd: Path) -> psutil.Process | None:
        """A helper child running a call made from ``cwd`` (it took the caller's working directory)."""
        for proc in self.helpers():
            try:
                if proc.cwd() == str(cwd):
                    return proc
            except psutil.Error:
                continue
        return None

    def stop_helpers(self) -> None:
        for proc in self.helpers():
            try:
                proc.kill()
            except psutil.Error:
                continue


async def finished(proc: asyncio.subprocess.Process, stdin: bytes | None = None, timeout: float = 60) -> Run:
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """Short, as a real one is (/run/user/<uid>): a socket's path has a limit of 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gt-run-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shell(gt_env: dict[str, str], town: TownConfig, runtime_dir: Path, tmp_path: Path) -> Iterator[Shell]:
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), "XDG_RUNTIME_DIR": str(runtime_dir)}
    env.pop("GT_HELPER", None)
    shell = Shell(env, cwd)
    yield shell
    shell.stop_helpers()


@pytest.fixture
async def mayor(gt_env: dict[str, str], town: TownConfig, tmp_path: Path) -> AsyncIterator[ServiceProcess]:
    process = ServiceProcess(
        "mayor", {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home)}, tmp_path / "mayor.log"
    )
    process.start()
    try:
        await assert_eventually(lambda: process.logged("activity_acquired"), timeout=60, interval=0.1)
        yield process
    finally:
        process.stop()


async def helper_ready(shell: Shell) -> psutil.Process:
    """The first call ran in its own process and started a helper; wait until it and its spares are there."""

    def spares_forked() -> bool:
        helper = shell.helper()
        return helper is not None and len(helper.children()) >= 2

    await assert_eventually(spares_forked, timeout=60)
    helper = shell.helper()
    assert helper is not None
    return helper


def alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


async def started_in_helper(shell: Shell, proc: asyncio.subprocess.Process) -> psutil.Process:
    """The helper child running ``proc``'s call (found by the working directory it took over)."""
    found: list[psutil.Process] = []

    def running() -> bool:
        assert proc.returncode is None, "the call ended before it was seen running in the helper"
        child = shell.call_running_in(shell.cwd)
        if child is not None:
            found.append(child)
        return child is not None

    await assert_eventually(running, timeout=30, interval=0.02)
    return found[0]


async def test_calls_through_the_helper_answer_as_calls_in_their_own_process(
    shell: Shell, mayor: ServiceProcess
) -> None:
    first = await shell("bead", "create", "made without a helper")
    assert first.code == 0, first.err
    helper = await helper_ready(shell)

    created = await shell("bead", "create", "made through the helper", "--description", "üñí")
    assert created.code == 0, created.err
    assert BEAD_ID.fullmatch(created.out.strip()), created.out
    shown = await shell("bead", "show", created.out.strip())
    assert (shown.code, "made through the helper" in shown.out, "üñí" in shown.out) == (0, True, True), shown
    as_json = await shell("bead", "show", created.out.strip(), "--json")  # printed by code that bound stdout early
    assert as_json.code == 0, as_json.err
    assert json.loads(as_json.out)["title"] == "made through the helper"
    still = shell.helper()
    assert still is not None
    assert still.pid == helper.pid

    # Standard input is the caller's own: a mail body piped in arrives.
    mailed = await shell("mail", "send", "operator", "--subject", "piped", stdin=b"a body from a pipe\n")
    assert mailed.code == 0, mailed.err
    read = await shell("mail", "read", mailed.out.split(":")[0])
    assert read.code == 0, read.err
    assert "a body from a pipe" in read.out, read.out

    # The environment is the caller's, per call: this one names a server where none listens.
    elsewhere = await shell("ready", NATS_URL="nats://127.0.0.1:1")
    assert elsewhere.code == EXIT_UNREACHABLE, elsewhere
    # Usage errors and their exit code, as argparse gives them.
    wrong = await shell("bead", "nosuch")
    assert (wrong.code, "usage: gt bead" in wrong.err, wrong.out) == (2, True, ""), wrong
    helped = await shell("--help")
    assert (helped.code, "Operate a gastown-nats town" in helped.out) == (0, True), helped

    # And these calls ran in the helper: one made while the mayor is frozen is found running there, in the
    # caller's working directory.
    mayor.signal(signal.SIGSTOP)
    try:
        waiting = await shell.start("bead", "create", "made while the mayor is frozen")
        child = await started_in_helper(shell, waiting)
        assert child.ppid() == helper.pid
    finally:
        mayor.signal(signal.SIGCONT)
    done = await finished(waiting)
    assert done.code == 0, done
    assert BEAD_ID.fullmatch(done.out.strip()), done


async def test_a_call_whose_helper_is_killed_under_it_still_gets_exactly_one_outcome(
    shell: Shell, mayor: ServiceProcess
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    mayor.signal(signal.SIGSTOP)
    try:
        waiting = await shell.start("bead", "create", "sent once")
        running = await started_in_helper(shell, waiting)
        helper.kill()
        # Its free workers take calls until they notice it is gone (within a second): wait for that, so that the
        # calls below find nobody at the socket instead of an orphaned worker.
        await assert_eventually(lambda: [p.pid for p in shell.helpers() if alive(p)] == [running.pid])
    finally:
        mayor.signal(signal.SIGCONT)
    done = await finished(waiting)
    assert done.code == 0, done
    assert BEAD_ID.fullmatch(done.out.strip()), done.out
    listed = await shell("bead", "list", "--json")
    assert listed.code == 0, listed.err
    assert listed.out.count('"sent once"') == 1, listed.out

    # The next call finds nobody at the socket: it runs in its own process and starts a new helper.
    after = await shell("bead", "create", "after the helper died")
    assert after.code == 0, after.err
    replacement = await helper_ready(shell)
    assert replacement.pid != helper.pid


async def test_a_stopped_helper_does_not_hold_calls_and_never_runs_one_late(
    shell: Shell, mayor: ServiceProcess
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    frozen = [helper, *helper.children()]
    for proc in frozen:
        proc.suspend()
    try:
        made = await shell("bead", "create", "made while the helper is stopped")
    finally:
        for proc in frozen:
            proc.resume()
    assert made.code == 0, made.err
    assert BEAD_ID.fullmatch(made.out.strip()), made.out
    assert "did not take the call in time; running it here" in made.err
    # Resumed, a worker takes the connection that call left behind: the caller has gone, so it does not run it.
    # The next call's connection is queued behind it, so once that call is answered through the helper, the
    # abandoned one has been taken and dropped.
    after = await shell("ready")
    assert (after.code, "did not take the call" in after.err) == (0, False), after
    listed = await shell("bead", "list", "--json")
    assert listed.code == 0, listed.err
    assert listed.out.count('"made while the helper is stopped"') == 1, listed.out


async def test_ctrl_c_reaches_the_call_running_in_the_helper(shell: Shell, mayor: ServiceProcess) -> None:
    assert (await shell("ready")).code == 0
    await helper_ready(shell)
    mayor.signal(signal.SIGSTOP)
    try:
        waiting = await shell.start("bead", "create", "interrupted")
        child = await started_in_helper(shell, waiting)
        waiting.send_signal(signal.SIGINT)
        done = await finished(waiting)
    finally:
        mayor.signal(signal.SIGCONT)
    assert done.code == 130, done  # as a call in its own process ends on Ctrl-C
    await assert_eventually(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE)


async def test_a_changed_source_file_retires_the_helper(shell: Shell, mayor: ServiceProcess, tmp_path: Path) -> None:
    """A helper that imported code since changed would answer with the old code: it steps aside instead. The code
    is a copy of the project's, so no other test's helper sees the change."""
    code = tmp_path / "code"
    for package in ("gt", "shared", "services"):
        shutil.copytree(REPO_ROOT / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    shell.env["PYTHONPATH"] = str(code)
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    assert helper.environ().get("PYTHONPATH") == str(code)  # this copy's own helper
    source = code / "gt" / "cli" / "render.py"
    before = source.stat()
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    changed = await shell("bead", "create", "after a change")
    assert changed.code == 0, changed.err
    await assert_eventually(lambda: not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE)
    again = await shell("ready")
    assert again.code == 0, again.err
    assert (await helper_ready(shell)).pid != helper.pid


async def test_no_helper_with_gt_helper_0_or_a_runtime_directory_open_to_others(
    shell: Shell, mayor: ServiceProcess, runtime_dir: Path
) -> None:
    for _ in range(3):
        run = await shell("ready", GT_HELPER="0")
        assert run.code == 0, run.err
    await asyncio.sleep(1)  # an absence: a helper started by these calls would be there (and listed) by now
    assert shell.helpers() == []
    assert not (runtime_dir / "gt").exists()

    (runtime_dir / "gt").mkdir(mode=0o777)
    (runtime_dir / "gt").chmod(0o777)  # past the umask: anyone could put a socket there
    for _ in range(3):
        run = await shell("ready")
        assert run.code == 0, run.err
    await asyncio.sleep(1)  # an absence again, as above
    assert shell.helpers() == []
    assert list((runtime_dir / "gt").iterdir()) == []


RAN_HERE = "| gt.cli.main"
"""In a call's stderr under ``PYTHONPROFILEIMPORTTIME=1``: the call imported the client itself (ran in its own
process). A helper's worker never does (its helper imported it), and the helper does not get the variable."""


async def test_calls_made_at_once_with_no_helper_start_one_and_all_run_in_it(
    shell: Shell, mayor: ServiceProcess
) -> None:
    """A script's first calls come faster than a helper starts: each waits for the one helper instead of
    importing the client itself (and starting a helper of its own) as it did."""
    assert shell.helpers() == []
    calls = [await shell.start("ready", PYTHONPROFILEIMPORTTIME="1") for _ in range(4)]
    runs = [await finished(call) for call in calls]
    assert [run.code for run in runs] == [0, 0, 0, 0], runs
    assert [RAN_HERE in run.err for run in runs] == [False] * 4, [run.err[-2000:] for run in runs]
    helper = await helper_ready(shell)
    # One helper: the others started for these calls found its lock taken and went.
    await assert_eventually(lambda: {proc.pid for proc in shell.helpers()} == {helper.pid, *_workers(helper)})
    after = await shell("ready", PYTHONPROFILEIMPORTTIME="1")
    assert (after.code, RAN_HERE in after.err) == (0, False), after


async def test_a_polecat_sessions_calls_run_in_a_helper_of_its_own(shell: Shell, mayor: ServiceProcess) -> None:
    """A session's helper is its own (its key has ``GT_SESSION``), and it serves its session: its key, computed in
    the helper, is the one the session's calls send. (It was not: the helper's environment lacked ``GT_SESSION``,
    so it refused every call of its session and each ran in its own process, paying the whole start.)"""
    assert (await shell("ready")).code == 0
    own = await helper_ready(shell)
    runs = [await shell("--help", GT_SESSION="hq-abc123-1", PYTHONPROFILEIMPORTTIME="1") for _ in range(3)]
    assert [(run.code, "Operate a gastown-nats town" in run.out) for run in runs] == [(0, True)] * 3, runs
    assert [RAN_HERE in run.err for run in runs] == [False] * 3, [run.err[-1500:] for run in runs]
    helpers = shell.helpers()
    pids = {h.pid for h in helpers}
    session_helpers = [h for h in helpers if h.pid != own.pid and h.ppid() not in pids]  # not a worker
    assert len(session_helpers) == 1, session_helpers
    assert session_helpers[0].environ().get("GT_SESSION") == "hq-abc123-1"


async def test_a_helper_that_cannot_start_leaves_the_call_to_its_own_process(
    shell: Shell, mayor: ServiceProcess, runtime_dir: Path
) -> None:
    path = launch_socket(shell)
    assert path.startswith(str(runtime_dir))
    Path(path + ".lock").mkdir()  # the helper cannot open its lock: it ends at once
    run = await shell("ready", PYTHONPROFILEIMPORTTIME="1")
    assert (run.code, RAN_HERE in run.err) == (0, True), run
    assert shell.helpers() == []


async def test_a_helper_whose_socket_is_removed_ends_and_the_next_call_starts_another(
    shell: Shell, mayor: ServiceProcess
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    os.unlink(launch_socket(shell))
    await assert_eventually(lambda: not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE)
    run = await shell("ready", PYTHONPROFILEIMPORTTIME="1")
    assert (run.code, RAN_HERE in run.err) == (0, False), run
    assert (await helper_ready(shell)).pid != helper.pid


def launch_socket(shell: Shell) -> str:
    """The helper socket a call from ``shell`` uses, as ``gt.launch`` finds it."""
    code = "from gt import launch; print(launch.socket_path())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=shell.env, cwd=shell.cwd, capture_output=True, text=True, check=True
    )
    assert launch.MAX_SOCKET_PATH > len(out.stdout.strip()) > 0, out
    return out.stdout.strip()


def _workers(helper: psutil.Process) -> set[int]:
    return {child.pid for child in helper.children() if child.status() != psutil.STATUS_ZOMBIE}


async def test_workers_run_call_after_call_and_no_call_meets_what_the_one_before_had(
    shell: Shell, mayor: ServiceProcess, tmp_path: Path
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    await assert_eventually(lambda: len(_workers(helper)) >= 2)
    before = _workers(helper)
    for _ in range(6):
        done = await shell("ready")
        assert done.code == 0, done.err
    # The workers that were there ran them and are still there (one more may have been forked to stand by while
    # a call ran): no process per call.
    assert before <= _workers(helper)

    # Each call has its own standard input, environment and working directory, whichever worker runs it.
    first = await shell("mail", "send", "operator", "--subject", "one", stdin=b"the first body\nand more\n")
    second = await shell("mail", "send", "operator", "--subject", "two", stdin=b"the second body\n")
    assert (first.code, second.code) == (0, 0), (first, second)
    one = await shell("mail", "read", first.out.split(":")[0])
    two = await shell("mail", "read", second.out.split(":")[0])
    assert ("the first body" in one.out, "and more" in one.out) == (True, True), one
    assert ("the second body" in two.out, "the first body" in two.out) == (True, False), two
    unreachable = await shell("ready", NATS_URL="nats://127.0.0.1:1")
    assert unreachable.code == EXIT_UNREACHABLE, unreachable
    again = await shell("ready")
    assert again.code == 0, again  # the bad NATS_URL went with its call
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shell.cwd = elsewhere
    assert (await shell("ready")).code == 0
    assert all(psutil.Process(pid).cwd() == "/" for pid in _workers(helper))  # none kept a caller's directory
    assert before <= _workers(helper)


async def test_each_call_logs_at_its_own_level_whichever_worker_ran_the_one_before(
    shell: Shell, mayor: ServiceProcess
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    await assert_eventually(lambda: len(_workers(helper)) >= 2)
    before = _workers(helper)
    for _ in range(3):  # more calls than workers: some worker runs a quiet call right after a loud one
        loud = await shell("ready", GT_LOG_LEVEL="DEBUG")
        # Its connection to NATS closed, or kept for the next call (shared/bus/kept.py): said at debug level.
        assert (loud.code, "nats_closed" in loud.err or "nats_connection_kept" in loud.err) == (0, True), loud
        quiet = await shell("ready", GT_LOG_LEVEL="ERROR")
        assert (quiet.code, quiet.err) == (0, ""), quiet
    assert before <= _workers(helper)  # and no worker had to go for it


async def test_sigusr2_has_a_call_running_in_the_helper_print_its_tasks_and_go_on(
    shell: Shell, mayor: ServiceProcess
) -> None:
    """``kill -USR2`` of a ``gt`` that does not finish prints what its tasks wait for (docs/operating.md); sent to
    the ``gt`` a user sees, it reaches the worker running the call, which then finishes as usual."""
    assert (await shell("ready")).code == 0
    await helper_ready(shell)
    mayor.signal(signal.SIGSTOP)
    try:
        waiting = await shell.start("bead", "create", "looked into")
        await started_in_helper(shell, waiting)
        stderr = waiting.stderr
        assert stderr is not None
        said: list[bytes] = []

        async def stacks_printed() -> bool:
            # Until the call has set its handler, the worker ignores the signal: send it again until answered.
            waiting.send_signal(signal.SIGUSR2)
            with contextlib.suppress(TimeoutError):
                said.append(await asyncio.wait_for(stderr.readline(), 0.5))
            return any(b"gt: task stacks" in line for line in said)

        printed: bool = await assert_eventually(stacks_printed, timeout=30)
        assert printed
    finally:
        mayor.signal(signal.SIGCONT)
    done = await finished(waiting)
    assert done.code == 0, done
    assert BEAD_ID.fullmatch(done.out.strip()), done.out
