"""Run inside a polecat's tmux pane by its agent command, with exactly the environment the witness gives the
session: the attacks on the gate runners (tests/integration/test_hostile_gate_jobs.py judges what they did).

Two roles, by the bead the session works on:

- the author (any bead but the watcher's): commits a red change (a file named ``FAIL_<...>``, which the rig's test gate
  refuses) and submits it with `gt done`; once only (a session of its bead sent back for rework just waits);
- the watcher (``WATCHER_BEAD``): waits in its pane for a gate job of the rig whose candidate holds that file (the
  refinery pushes every candidate to the rig's repository as ``refs/gt/gate/<job>``), then
  1. appends the job's answer itself, with the session's own NATS credentials: ``gate.started`` and a
     ``gate.finished`` that passed, on the job's subject ``gt.evt.gate.<job>`` (published, requested as a JetStream
     append, and as the reply of its own command's acknowledgement);
  2. swaps the candidate: pushes the candidate's parent (the stack below it, green) to ``refs/gt/gate/<job>`` in
     the rig's repository, which it can write on a laptop (the same OS user as the town), so that a runner
     fetching the job by its ref would gate a green commit for the red one.
  It writes what each attempt got to REPORT, and stays.

Standalone (nats-py, git and the standard library): it is copied as it is.

    python gate_pane.py REPORT ORIGIN WATCHER_BEAD
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import nats

MARK = "FORGED-BY-GATE-PANE"
RED_FILE = "FAIL_gate_pane"
WAIT_S = 300.0
GIT_OFF = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]


def git(*args: str, check: bool = True) -> str:
    done = subprocess.run(["git", *GIT_OFF, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def author(report: str) -> None:
    """The red change, submitted once."""
    done_marker = report + ".authored"
    if os.path.exists(done_marker):
        return  # sent back for rework: it attacked once, that is enough
    with open(RED_FILE, "w") as file:
        file.write("a change the test gate refuses\n")
    with open("red-work.txt", "w") as file:
        file.write(f"work of {os.environ['GT_BEAD']}\n")
    git("add", RED_FILE, "red-work.txt")
    git("commit", "-qm", "a red change")
    with open(done_marker, "w") as file:
        file.write(git("rev-parse", "HEAD"))
    subprocess.run(["gt", "done"], check=False)


def red_job(origin: str) -> tuple[str, str] | None:
    """A gate job of the rig whose candidate holds the red file: (job id, candidate commit)."""
    listed = git("ls-remote", origin, "refs/gt/gate/*", check=False)
    for line in listed.splitlines():
        commit, _, ref = line.partition("\t")
        git("fetch", "-q", origin, f"+{ref}:refs/pane/{ref.rsplit('/', 1)[-1]}", check=False)
        if subprocess.run(["git", "cat-file", "-e", f"{commit}:{RED_FILE}"], capture_output=True).returncode == 0:
            return ref.rsplit("/", 1)[-1], commit
    return None


def envelope(kind: str, data: dict[str, Any]) -> bytes:
    now = datetime.now(UTC).isoformat()
    return json.dumps(
        {"id": f"ev-{kind}-pane", "type": kind, "v": 1, "ts": now, "actor": "runner", "data": data}
    ).encode()


async def forge(job: str, report: dict[str, Any]) -> None:
    """The job's answer, written with the session's own credentials."""
    login: dict[str, Any] = {"user": os.environ.get("NATS_USER"), "password": os.environ.get("NATS_PASSWORD")}
    if not login["password"] and os.environ.get("NATS_PASSWORD_FILE"):
        with open(os.environ["NATS_PASSWORD_FILE"]) as file:
            login["password"] = file.readline().strip()
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(repr(exc))

    nc = await nats.connect(
        os.environ["NATS_URL"].split(","),
        error_cb=on_error,
        inbox_prefix=os.environ.get("NATS_INBOX_PREFIX", "_INBOX").encode(),
        max_reconnect_attempts=-1,
        **login,
    )
    subject = f"gt.evt.gate.{job}"
    started = envelope("gate.started", {"job_id": job, "runner": f"runner-{MARK}", "attempt": 9})
    result = {"gate": "test", "exit_code": 0, "seconds": 0.1, "tail": MARK, "log_path": "-"}
    finished = envelope(
        "gate.finished", {"job_id": job, "runner": f"runner-{MARK}", "attempt": 9, "passed": True, "results": [result]}
    )
    own_command = f"gt.cmd.mail.send.{os.environ['GT_RIG']}.{os.environ['GT_POLECAT']}.{os.environ['GT_SESSION']}"
    attempts = []
    try:
        for name, payload in (("gate.started", started), ("gate.finished", finished)):
            for how in ("publish", "request", "reply of its own command"):
                before = len(errors)
                try:
                    if how == "publish":
                        await nc.publish(subject, payload)
                        await nc.flush()
                        got = "sent"
                    elif how == "request":
                        answer = await nc.request(subject, payload, timeout=2)
                        got = f"answered: {answer.data[:200]!r}"
                    else:
                        await nc.publish(
                            own_command, json.dumps({"to": "operator", "body": "hi"}).encode(), reply=subject
                        )
                        await nc.flush()
                        got = "sent"
                except Exception as exc:
                    got = f"error: {exc!r}"
                await asyncio.sleep(0.2)  # a refusal reaches the error callback asynchronously
                refused = errors[before:]
                attempts.append({"event": name, "how": how, "result": f"refused: {refused}" if refused else got})
    finally:
        await nc.close()
    report["forged"] = attempts


def swap(origin: str, job: str, commit: str, report: dict[str, Any]) -> None:
    """The job's ref pointed at the candidate's parent: green, without the red change."""
    green = git("rev-parse", f"{commit}^")
    pushed = subprocess.run(
        ["git", *GIT_OFF, "push", "-q", "--force", origin, f"{green}:refs/gt/gate/{job}"],
        capture_output=True,
        text=True,
        check=False,
    )
    now = git("ls-remote", origin, f"refs/gt/gate/{job}", check=False).split("\t")[0]
    report["swap"] = {"job": job, "candidate": commit, "green": green, "pushed": pushed.returncode == 0, "now": now}


def watch(report_path: str, origin: str) -> None:
    report: dict[str, Any] = {"session": os.environ["GT_SESSION"], "uid": os.getuid()}
    deadline = time.monotonic() + WAIT_S
    found = None
    while found is None and time.monotonic() < deadline:
        found = red_job(origin)
        if found is None:
            time.sleep(0.1)
    if found is None:
        report["error"] = "no gate job of the red change was seen"
    else:
        job, commit = found
        asyncio.run(forge(job, report))
        swap(origin, job, commit, report)
    tmp = report_path + ".tmp"
    with open(tmp, "w") as file:
        json.dump(report, file, indent=1)
    os.replace(tmp, report_path)


def main(report: str, origin: str, watcher_bead: str) -> None:
    if os.environ["GT_BEAD"] == watcher_bead:
        if not os.path.exists(report):
            watch(report, origin)
    else:
        author(report)


if __name__ == "__main__":
    main(*sys.argv[1:4])
