"""The bus owns NATS (docs/architecture.md, "Where things are"): only ``shared/bus`` imports the NATS client; the
services, the plugins, the library around the bus and the clients hold a ``Connection`` and hand it to the bus's
ports. Every import counts: at module level, inside a function, and under ``TYPE_CHECKING`` (a type from nats-py
in a signature is a piece of NATS outside the bus all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("shared", "services", "gt", "bench")
BUS = "shared/bus/"
ENTRY_POINTS = frozenset(
    {
        # The benchmarks' harness measures each figure's ceiling on NATS itself (raw publishes, a bare ordered
        # consumer, a snapshot read without the service around it): what gastown's own code costs is the rest.
        "bench/common.py",
        "bench/replay.py",
        "bench/startup_probe.py",
    }
)
"""Files outside the bus allowed to import nats. The services' entry points (``services/*/__main__.py``,
``shared/service/entrypoint.py``) and the CLI's (``gt/cli/main.py``) do not need to: they go through the bus too."""


def nats_imports(path: Path) -> list[str]:
    """``<line>: <module>`` of every import of nats (or a module under it) in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {m}" for m in modules if m == "nats" or m.startswith("nats.")]
    return found


def offenders() -> list[str]:
    out = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where.startswith(BUS) or where in ENTRY_POINTS:
                continue
            out += [f"{where}:{line}" for line in nats_imports(path)]
    return out


def test_nothing_outside_the_bus_and_the_entry_points_imports_nats() -> None:
    assert offenders() == [], "import the bus's ports (shared/bus) instead of nats"


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    # The guard would pass vacuously if the walk missed an import it is meant to refuse.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "import nats\n"
        "import os, nats.errors as errs\n"
        "from nats.js.api import ConsumerConfig\n"
        "if TYPE_CHECKING:\n"
        "    from nats.aio.client import Client\n"
        "def later():\n"
        "    import nats.js.errors\n"
        "import natsort\n"
        "from . import nats_like\n"
    )
    assert nats_imports(sample) == [
        "2: nats",
        "3: nats.errors",
        "4: nats.js.api",
        "6: nats.aio.client",
        "8: nats.js.errors",
    ]


def test_the_bus_does_import_nats_and_every_entry_point_is_there() -> None:
    assert nats_imports(ROOT / "shared/bus/connection.py"), "the scan reads the bus too: it would see its imports"
    assert all((ROOT / where).is_file() for where in ENTRY_POINTS), "an entry point named here is gone"


# ---- the error boundary: what leaves the bus is the project's ------------------------------------------------------

MAPPED_BY_TYPE = "JetStreamContext"
"""A function that takes the client's JetStream context is the bus's own helper (only the bus holds one): it raises
the client's errors for its caller in the bus to catch, and the port that called it translates them."""
NOT_PORTS = frozenset(
    {
        # Awaits what it is given (a port's call, or the bus's own request) and raises only PermissionDeniedError.
        "shared/bus/permissions.py:guarded",
    }
)


def _names(node: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def unmapped_ports(path: Path, where: str) -> list[str]:
    """``<where>:<name>`` of every public coroutine or async generator of a bus module (module-level, or a method of
    a public class) that is not wrapped in ``map_errors``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    candidates: list[tuple[str, ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef):
            candidates.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            candidates += [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.AsyncFunctionDef)]
    for name, fn in candidates:
        if fn.name.startswith("_") or f"{where}:{name}" in NOT_PORTS:
            continue
        params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        if any(p.annotation is not None and MAPPED_BY_TYPE in ast.unparse(p.annotation) for p in params):
            continue
        if "map_errors" not in {n for d in fn.decorator_list for n in _names(d)}:
            found.append(f"{where}:{name}")
    return found


def test_every_port_of_the_bus_translates_the_clients_errors() -> None:
    ports = sorted((ROOT / "shared/bus").glob("*.py"))
    missing = [
        m for path in ports if path.name != "errors.py" for m in unmapped_ports(path, str(path.relative_to(ROOT)))
    ]
    assert missing == [], "wrap these in shared.bus.errors.map_errors: nothing of nats-py may leave the bus"


def test_the_port_scan_sees_an_unwrapped_port(tmp_path: Path) -> None:
    # The guard would pass vacuously if the scan missed a port it is meant to refuse.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from shared.bus.errors import map_errors\n"
        "async def bare(): ...\n"
        "@map_errors\nasync def wrapped(): ...\n"
        "async def _private(): ...\n"
        "async def helper(js: JetStreamContext): ...\n"
        "class Port:\n"
        "    async def method(self): ...\n"
        "    @map_errors\n    async def fine(self): ...\n"
        "class _Inner:\n"
        "    async def hidden(self): ...\n"
    )
    assert unmapped_ports(sample, "sample") == ["sample:bare", "sample:Port.method"]


def nats_catches(path: Path) -> list[str]:
    """``<line>`` of every ``except`` (or ``contextlib.suppress``) that names a class of nats-py."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        caught: list[ast.expr] = []
        line = 0
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            caught, line = [node.type], node.lineno
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
            caught, line = list(node.args), node.lineno
        for expr in caught:
            roots = [n for n in ast.walk(expr) if isinstance(n, ast.Attribute)]
            if any(ast.unparse(r).startswith("nats.") for r in roots):
                found.append(str(line))
    return found


def test_nothing_outside_the_bus_catches_a_class_of_nats() -> None:
    out = []
    for folder in ("shared", "services", "gt"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if not where.startswith(BUS):
                out += [f"{where}:{line}" for line in nats_catches(path)]
    assert out == [], "catch the project's errors (shared.core.errors: BusError and its subclasses)"
    assert nats_catches(ROOT / "shared/bus/append.py"), "the scan sees the bus's own catches"
