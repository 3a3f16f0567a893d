"""The package map holds: the library (``shared``) and the services never import a client (``gt``), no service
imports another, and the dashboard does not import the CLI (what both need lives in ``gt.story`` or ``shared``).
Every import counts, at module level or inside a function."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports_of(folder: str) -> Iterator[tuple[str, str]]:
    """(file relative to the root, imported module) for every import in the .py files under ``folder``."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                yield from ((where, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield where, node.module
                yield from ((where, f"{node.module}.{alias.name}") for alias in node.names)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_neither_the_library_nor_a_service_imports_a_client() -> None:
    found = [f"{where}: {module}" for folder in ("shared", "services") for where, module in imports_of(folder)]
    assert [line for line in found if within(line.split(": ")[1], "gt")] == []


def test_no_service_imports_another() -> None:
    crossing = []
    for service in sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").exists()):
        for where, module in imports_of(f"services/{service}"):
            if within(module, "services") and module.split(".")[1:2] not in ([service], []):
                crossing.append(f"{where}: {module}")
    assert crossing == []


def test_the_dashboard_does_not_import_the_cli() -> None:
    assert [f"{w}: {m}" for w, m in imports_of("gt/dashboard") if within(m, "gt.cli")] == []


def test_the_walk_sees_imports_inside_functions() -> None:
    # The guard would pass vacuously if the walk missed lazy imports: the CLI imports the town's lifecycle lazily.
    assert ("gt/cli/main.py", "gt.town.lifecycle") in set(imports_of("gt/cli"))


# The library's layers, bottom first (docs/architecture.md, "The library's layers"): a module imports only its own
# layer and the ones below it, so the pure model never reaches the bus or the host, and the bottom never reaches up.
LAYERS = ("core", "model", "host", "bus", "service", "plugins")


def test_the_librarys_layers_import_only_downward() -> None:
    upward = []
    for layer in LAYERS:
        for where, module in imports_of(f"shared/{layer}"):
            if within(module, "shared") and module.count(".") >= 1:
                target = module.split(".")[1]
                if target in LAYERS and LAYERS.index(target) > LAYERS.index(layer):
                    upward.append(f"{where}: {module}")
    assert upward == []


def test_the_library_is_its_layers_and_nothing_else() -> None:
    # What git holds: a folder an old checkout left with only caches in it is not a module.
    entries = {
        p.name
        for p in (ROOT / "shared").iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or any(p.rglob("*.py")))
    }
    assert entries == set(LAYERS)
