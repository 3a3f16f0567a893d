"""The witness's pidfd watch answers "is it still running" for every watched agent with one poll."""

from __future__ import annotations

import subprocess

from services.witness.effects.pidwatch import ExitWatcher
from shared.host import processes
from tests.helpers import assert_eventually


async def test_watched_processes_read_as_running_until_they_exit_and_only_as_the_process_recorded() -> None:
    exits = 0

    def on_exit() -> None:
        nonlocal exits
        exits += 1

    watcher = ExitWatcher(on_exit)
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        refs = {f"s{i}": ref for i, p in enumerate(procs) if (ref := processes.ref_of(p.pid)) is not None}
        assert len(refs) == 3
        assert watcher.running(refs) == set(), "nothing watched yet: nothing is vouched for"
        for key, ref in refs.items():
            watcher.watch(key, ref)
        assert watcher.running(refs) == {"s0", "s1", "s2"}
        other = processes.ProcessRef(pid=refs["s2"].pid, started=refs["s2"].started - 100)
        assert watcher.running({**refs, "s2": other}) == {"s0", "s1"}, "another process's ref is not vouched for"

        procs[1].kill()
        procs[1].wait()  # exited and reaped, and the loop has not run the watcher's callback yet
        assert watcher.running(refs) == {"s0", "s2"}, "the exit shows at once, before the callback ran"
        await assert_eventually(lambda: exits == 1, message="the loop ran the watcher's callback once")
        assert watcher.running(refs) == {"s0", "s2"}
    finally:
        watcher.close()
        for p in procs:
            p.kill()
            p.wait()
