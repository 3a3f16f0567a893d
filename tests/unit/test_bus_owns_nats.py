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
``shared/entrypoint.py``) and the CLI's (``gt/cli/main.py``) do not need to: they go through the bus too."""


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
