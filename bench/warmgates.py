"""(w) warm against cold gates: a set-up gate that installs dependencies, on a gate runner's persistent workspace.

Everything real: nats-server, mayor, witness, refinery and one gate runner (``gt-runner``) as their own
processes, real git, a real ``pip install`` (no network: ``--no-index`` and a wheel the benchmark writes in its
temporary directory, a package of many small modules, as a project's dependencies are).

Two rigs in one town, alike but for ``gate_pristine``; their set-up gate is what a Python project's is::

    [ -x .venv/bin/python ] || python -m venv .venv
    .venv/bin/python -m pip install --no-index --find-links <wheels> -r requirements.txt

with ``.venv/`` in ``.gitignore``, and their test gate imports the package from ``.venv``. The refinery gates
each merge as a job on the runner (``GT_MQ_RUNNERS=1``), which keeps a persistent gate workspace per rig
(``shared.host.gates.workspace``): ignored files (the ``.venv``) survive from one merge to the next, unless the rig is
``gate_pristine``, whose workspace is cleaned of them before every merge (always cold). Merges are submitted one at
a time, the two rigs taking turns, each a change of one new file (requirements unchanged).

The figure is the set-up gate's seconds (as the runner recorded them in ``gate.finished``) on the second merge of
the persistent rig (warm: the environment is there, pip finds everything satisfied), against the first merge of
the same rig (cold: the environment made and the package installed), and against the pristine rig's second merge
(always cold). The ratio is cold / warm as for every time (higher is better); the note gives warm / cold.

python -m bench.warmgates            # a package of 2,000 modules, 3 merges a rig
python -m bench.warmgates --quick    # 200 modules, 2 merges a rig
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import logging
import os
import shlex
import sys
import tempfile
import time
import uuid
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import structlog

from bench.common import LOG_DIR, Figure, provisioned, server, start_service, wait_ready
from bench.refinery import IDENTITY, MergeEvents
from bench.reposize import stop_all
from bench.speculative import SERVICES, GateLog, runners_ready, start_runners
from bench.witness import command
from shared.bus.connection import Connection
from shared.host import git
from shared.model.commands import BeadCreate, MergeRequestSubmit, RigAdd

PACKAGE = "benchdeps"
VERSION = "1.0"
WHEEL = b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
MERGE_TIMEOUT_S = 600.0
SETUP = """set -e
[ -x .venv/bin/python ] || "$1" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-index \\
    --find-links "$2" -r requirements.txt
"""
"""The rigs' set-up script: ``$1`` the interpreter to make the environment with, ``$2`` where the wheels are."""


def make_wheel(where: Path, modules: int) -> Path:
    """A pure-Python wheel of ``PACKAGE`` with ``modules`` small modules, 100 to a subpackage (written directly:
    a wheel is a zip with its metadata and record)."""
    where.mkdir(parents=True, exist_ok=True)
    wheel = where / f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    info = f"{PACKAGE}-{VERSION}.dist-info"
    record: list[str] = []

    def add(archive: zipfile.ZipFile, path: str, data: bytes) -> None:
        archive.writestr(path, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")

    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        add(archive, f"{PACKAGE}/__init__.py", f"MODULES = {modules}\n".encode())
        for package in range((modules + 99) // 100):
            add(archive, f"{PACKAGE}/p{package:03d}/__init__.py", b"")
        for i in range(modules):
            body = f'"""Module {i} of the benchmark\'s dependency."""\n\nVALUE = {i}\n\n\n' + "".join(
                f"def f{k}(x: int) -> int:\n    return x * {k} + VALUE\n\n\n" for k in range(20)
            )
            add(archive, f"{PACKAGE}/p{i // 100:03d}/m{i % 100:03d}.py", body.encode())
        add(archive, f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode())
        add(archive, f"{info}/WHEEL", WHEEL)
        record.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def make_project(root: Path, name: str) -> Path:
    """A bare origin of a project whose dependencies go into ``.venv`` (ignored), and a clone to push changes from
    (``root/<name>-pusher``)."""
    src = root / f"{name}-src"
    src.mkdir(parents=True)
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "README.md").write_text("a project with dependencies, for the benchmark\n")
    (src / ".gitignore").write_text(".venv/\n")
    (src / "requirements.txt").write_text(f"{PACKAGE}=={VERSION}\n")
    (src / "setup.sh").write_text(SETUP)
    git.git("add", ".", cwd=src)
    git.git(*IDENTITY, "commit", "--quiet", "-m", "init", cwd=src)
    origin = root / f"{name}.git"
    git.git("clone", "--quiet", "--bare", str(src), str(origin))
    git.git("clone", "--quiet", str(origin), str(root / f"{name}-pusher"))
    return origin


def push_change(root: Path, name: str, n: int) -> tuple[str, str]:
    """A branch off the current main adding one file; (branch, head)."""
    clone = root / f"{name}-pusher"
    branch = f"change-{n}"
    git.git("fetch", "--quiet", "origin", cwd=clone)
    git.git("checkout", "--quiet", "-B", branch, "origin/main", cwd=clone)
    (clone / f"change-{n:02d}.txt").write_text(f"change {n}\n")
    git.git("add", ".", cwd=clone)
    git.git(*IDENTITY, "commit", "--quiet", "-m", f"change {n}", cwd=clone)
    git.git("push", "--quiet", "origin", f"{branch}:refs/heads/{branch}", cwd=clone)
    return branch, git.git("rev-parse", "HEAD", cwd=clone).strip()


async def merge_one(nc: Connection, events: MergeEvents, root: Path, rig: str, n: int) -> str:
    """One change of ``rig`` submitted and merged; its merge request."""
    bead = (await command(nc, BeadCreate(title=f"{rig} change {n}", prefix=rig))).id
    branch, head = await asyncio.to_thread(push_change, root, rig, n)
    result = await command(nc, MergeRequestSubmit(bead=bead, rig=rig, branch=branch, head=head))
    mr_id = str(result.id)
    await events.wait_for(lambda: mr_id in events.settled, timeout=MERGE_TIMEOUT_S)
    if events.settled[mr_id][1] != "mr.merged":
        raise RuntimeError(f"{rig} change {n}: {events.settled[mr_id][1]} (see the runner's gate logs)")
    return mr_id


def setup_seconds(jobs: GateLog, mr_id: str) -> float:
    """The set-up gate's seconds in the job that gated ``mr_id`` alone."""
    found = [job for job in jobs.jobs.values() if job.stack == [mr_id] and job.finished is not None and job.passed]
    if len(found) != 1:
        raise RuntimeError(f"{mr_id}: {len(found)} passed gate jobs of it alone")
    return next(float(r["seconds"]) for r in found[0].results if r["gate"] == "setup")


RIGS = (("warm", False), ("pristine", True))
"""(name, gate_pristine) of the two rigs."""


async def measure(modules: int, merges: int) -> tuple[dict[str, list[float]], str]:
    """Each rig's set-up gate seconds, merge by merge; the machine's load around the merges."""
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:4]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-warm-") as tmp, server() as srv:
        root = Path(tmp)
        wheels = root / "wheels"
        await asyncio.to_thread(make_wheel, wheels, modules)
        origins = {name: await asyncio.to_thread(make_project, root, name) for name, _ in RIGS}
        nc, town = await provisioned(srv.url)
        env = {
            "GT_HOME": str(root / "home"),
            "GT_TMUX_SOCKET": f"gt-bench-{uuid.uuid4().hex[:8]}",
            "GT_MQ_RUNNERS": "1",
        }
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        procs = {
            name: start_service(name, srv.url, env=env, log_path=LOG_DIR / f"{name}-warm-{stamp}.log")
            for name in SERVICES
        }
        runners = start_runners(1, srv.url, env, f"warm-{stamp}")
        events = MergeEvents()
        try:
            for name in SERVICES:
                await wait_ready(nc, name)
            await runners_ready(runners)
            await events.subscribe(nc)
            setup = f"sh ./setup.sh {shlex.quote(sys.executable)} {shlex.quote(str(wheels))}"
            test = f".venv/bin/python -c 'import {PACKAGE}.p000.m000'"
            for name, pristine in RIGS:
                await command(
                    nc,
                    RigAdd(
                        name=name, repo=str(origins[name]), setup_command=setup, test_command=test,
                        gate_pristine=pristine,
                    ),
                )  # fmt: skip
            merged: dict[str, list[str]] = {name: [] for name, _ in RIGS}
            load_before = os.getloadavg()[0]
            for n in range(merges):
                for name, _ in RIGS:
                    merged[name].append(await merge_one(nc, events, root, name, n))
            jobs = await GateLog.read(nc, town.evt_stream)
            seconds = {name: [setup_seconds(jobs, mr) for mr in mrs] for name, mrs in merged.items()}
            for name, values in seconds.items():
                print(f"  {name}: set-up gate {', '.join(f'{v:.2f}' for v in values)}s, merge by merge", flush=True)
            return seconds, f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        finally:
            everything = {**procs, **{f"runner-{n}": p for n, (p, _) in enumerate(runners)}}
            try:
                await asyncio.to_thread(stop_all, everything, env["GT_TMUX_SOCKET"])
            finally:
                await nc.close()


def figures_of(modules: int, seconds: dict[str, list[float]], load: str) -> list[Figure]:
    warm, pristine = seconds["warm"], seconds["pristine"]
    what = f"(w) set-up gate installing a dependency ({modules:,} modules) on a runner, second merge"

    def listed(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values) + " s"

    each = f"merge by merge: persistent {listed(warm)}; pristine {listed(pristine)}"
    return [
        Figure(
            name=f"{what} (warm: persistent workspace)",
            value=warm[1],
            unit="s",
            ceiling=warm[0],
            ceiling_name="its first merge (cold)",
            higher_is_better=False,
            notes=[f"warm/cold = {warm[1] / warm[0]:.2f}", each, load],
        ),
        Figure(
            name=f"{what}, warm against a pristine rig's (gate_pristine: always cold)",
            value=warm[1],
            unit="s",
            ceiling=pristine[1],
            ceiling_name="the pristine rig's second merge",
            higher_is_better=False,
            notes=[f"warm/pristine = {warm[1] / pristine[1]:.2f}", f"pristine's first merge {pristine[0]:.2f} s"],
        ),
    ]


async def run(modules: int = 2000, merges: int = 3) -> list[Figure]:
    seconds, load = await measure(modules, max(2, merges))
    figures = figures_of(modules, seconds, load)
    for figure in figures:
        print(figure.line(), flush=True)
        print(f"    {'; '.join(figure.notes)}", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warmgates", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 modules, 2 merges a rig, for a smoke run")
    parser.add_argument("--modules", type=int, help="modules in the dependency (default 2,000; 200 quick)")
    parser.add_argument("--merges", type=int, help="merges a rig, the first cold (default 3; 2 quick; at least 2)")
    args = parser.parse_args()
    modules = args.modules or (200 if args.quick else 2000)
    merges = args.merges or (2 if args.quick else 3)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    started = time.perf_counter()
    asyncio.run(run(modules, merges))
    print(f"{time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
