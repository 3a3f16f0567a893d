"""Every service is laid out alike (docs/architecture.md, "One service"): a reader who learns one can read the
next. Its top-level modules and packages take their names from one short list; a big part may be a package of
modules (``decide/beads.py``), but nothing new sits beside them under a name of its own. And each holds what its
name says: ``service.py`` is wiring (no event or command built there, a bounded size), folds are registered only
in projection modules, a package's ``__init__`` is a face (docstring, imports, ``__all__``), never logic."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SERVICES = ("mayor", "witness", "refinery", "deacon", "runner")
SHAPE = frozenset(
    {"__init__", "__main__", "settings", "state", "projection", "decide", "plan", "effects", "queries", "service"}
)
"""What each name holds: ``state`` the projection's data, ``projection`` the pure folds, ``decide`` command ->
events or a rejection (pure), ``plan`` state and time -> what is owed now (pure), ``effects`` the only I/O besides
the bus, ``queries`` the answers to ``gt.q.<service>.*``, ``service`` the wiring."""
CORE = SHAPE - {"settings"}
"""What every service has (the mayor has no settings of its own: its one knob is town configuration)."""
NOT_HELD = {"runner": frozenset({"decide", "queries"})}
"""What a service has no use for: the gate runner takes no commands (its work comes from the log) and answers no
query of its own (its status is every service's)."""
SUB_PACKAGES = {"deacon": frozenset({"automations"})}
"""Parts big enough to be laid out like a service of their own (the deacon's automations)."""

ROOT = Path(__file__).resolve().parents[2] / "services"


def top_level_names(service_dir: Path) -> set[str]:
    names = set()
    for entry in service_dir.iterdir():
        if entry.is_file() and entry.suffix == ".py":
            names.add(entry.stem)
        elif entry.is_dir() and any(entry.glob("*.py")):
            names.add(entry.name)
    return names


def test_every_service_names_its_modules_from_the_one_shape() -> None:
    strays = sorted(
        f"services/{name}/{module}"
        for name in SERVICES
        for module in top_level_names(ROOT / name) - SHAPE - SUB_PACKAGES.get(name, frozenset())
    )
    assert not strays, f"modules outside the shape {sorted(SHAPE)}: {strays}"


def test_every_service_has_the_core_of_the_shape() -> None:
    missing = sorted(
        f"services/{name}/{module}"
        for name in SERVICES
        for module in CORE - NOT_HELD.get(name, frozenset()) - top_level_names(ROOT / name)
    )
    assert not missing, f"missing: {missing}"


def test_the_witness_finds_the_checkout_it_runs_from() -> None:
    # Its .tools/npm holds the Claude Code that ./dev setup installed; a module moved deeper must still find it.
    from services.witness.effects import runtime_setup

    assert (runtime_setup.PROJECT_ROOT / "pyproject.toml").is_file(), runtime_setup.PROJECT_ROOT


# ---- content: what each module holds, not only its name ----------------------------------------------------

SERVICE_PY_MAX_LINES = 250
"""``service.py`` is wiring: the base's hooks handed on to the pure modules and the effects."""
BUILDING_MODULES = ("shared.model.commands", "shared.model.events")
"""A class from these, called, is a command or an event built: the pure modules decide those, not the wiring."""
INIT_STATEMENTS = (ast.Import, ast.ImportFrom)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def built_in(tree: ast.Module) -> list[str]:
    """``line: name`` of every event or command built in ``tree``: a call of ``NewEvent`` or of a class imported
    from ``shared.model.commands``/``shared.model.events`` (by name, or through the module:
    ``commands.BeadClose(...)``)."""
    classes: dict[str, str] = {}
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if any(_within(full, package) for package in BUILDING_MODULES) and full not in BUILDING_MODULES:
                    found = getattr(importlib.import_module(node.module), alias.name, None)
                    if isinstance(found, type):
                        classes[alias.asname or alias.name] = full
                elif full in BUILDING_MODULES:
                    modules[alias.asname or alias.name] = full
                if full == "shared.model.decision.NewEvent":
                    classes[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_within(alias.name, package) for package in BUILDING_MODULES):
                    modules[alias.asname or alias.name] = alias.name
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in classes:
            out.append(f"{node.lineno}: {func.id}(")
        elif isinstance(func, ast.Attribute) and ast.unparse(func.value) in modules:
            found = getattr(importlib.import_module(modules[ast.unparse(func.value)]), func.attr, None)
            if isinstance(found, type):
                out.append(f"{node.lineno}: {ast.unparse(func)}(")
    return sorted(out, key=lambda line: int(line.split(":")[0]))


def fold_registrations(tree: ast.Module) -> list[int]:
    """Lines registering a fold handler (``@fold.register``, ``fold_disk.register(...)``, ``_fold.register``)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "register"
        and isinstance(node.value, ast.Name)
        and "fold" in node.value.id.lower()
    )


def logic_in_init(tree: ast.Module) -> list[str]:
    """``line: statement`` of what a package ``__init__`` holds besides its docstring, imports and ``__all__``."""
    out = []
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, INIT_STATEMENTS):
            continue
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if targets and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        out.append(f"{node.lineno}: {type(node).__name__}")
    return out


def _files(service: str) -> list[Path]:
    return sorted((ROOT / service).rglob("*.py"))


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


@pytest.mark.parametrize("service", SERVICES)
def test_service_py_builds_no_event_and_no_command(service: str) -> None:
    built = built_in(_parse(ROOT / service / "service.py"))
    assert not built, f"services/{service}/service.py builds events or commands (the plan's or decide's job): {built}"


@pytest.mark.parametrize("service", SERVICES)
def test_folds_are_registered_only_in_projection_modules(service: str) -> None:
    strays = [
        f"{_where(path)}:{line}"
        for path in _files(service)
        if path.name != "projection.py"
        for line in fold_registrations(_parse(path))
    ]
    assert not strays, f"fold handlers outside a projection module: {strays}"


@pytest.mark.parametrize("service", SERVICES)
def test_service_py_is_wiring_sized(service: str) -> None:
    lines = len((ROOT / service / "service.py").read_text(encoding="utf-8").splitlines())
    assert lines <= SERVICE_PY_MAX_LINES, (
        f"services/{service}/service.py has {lines} lines (at most {SERVICE_PY_MAX_LINES})"
    )


@pytest.mark.parametrize("service", SERVICES)
def test_package_inits_hold_no_logic(service: str) -> None:
    found = [
        f"{_where(path)}:{statement}"
        for path in _files(service)
        if path.name == "__init__.py"
        for statement in logic_in_init(_parse(path))
    ]
    assert not found, f"a package __init__ holds only its docstring, imports and __all__: {found}"


def test_the_content_checks_see_what_they_look_for() -> None:
    # They would pass vacuously if the walks missed the forms the code uses.
    wiring = ast.parse(
        "from shared.model import commands\n"
        "from shared.model.commands import BeadClose, Command, parse_command\n"
        "from shared.model.decision import NewEvent\n"
        "from shared.model.events import ServiceUp\n"
        "def f(cmd: Command) -> None:\n"
        "    NewEvent(payload=ServiceUp(service='a', instance='b'), expected_seq=0)\n"
        "    BeadClose(id='x')\n"
        "    commands.BeadClose(id='x')\n"
        "    parse_command('gt.cmd.bead.close', b'{}')\n"
    )
    assert built_in(wiring) == ["6: NewEvent(", "6: ServiceUp(", "7: BeadClose(", "8: commands.BeadClose("]
    folds = ast.parse("@fold.register\ndef a(): ...\n@_fold.register\ndef b(): ...\nfold_disk.register(c)\n")
    assert fold_registrations(folds) == [1, 3, 5]
    init = ast.parse('"""doc."""\nfrom a import b\n__all__ = ["b"]\nX = 1\ndef f(): ...\n')
    assert logic_in_init(init) == ["4: Assign", "5: FunctionDef"]
