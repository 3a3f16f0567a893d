"""Every service is laid out alike (docs/architecture.md, "One service"): a reader who learns one can read the
next. Its top-level modules and packages take their names from one short list; a big part may be a package of
modules (``decide/beads.py``), but nothing new sits beside them under a name of its own."""

from __future__ import annotations

from pathlib import Path

SERVICES = ("mayor", "witness", "refinery", "deacon")
SHAPE = frozenset(
    {"__init__", "__main__", "settings", "state", "projection", "decide", "plan", "effects", "queries", "service"}
)
"""What each name holds: ``state`` the projection's data, ``projection`` the pure folds, ``decide`` command ->
events or a rejection (pure), ``plan`` state and time -> what is owed now (pure), ``effects`` the only I/O besides
the bus, ``queries`` the answers to ``gt.q.<service>.*``, ``service`` the wiring."""
CORE = SHAPE - {"settings"}
"""What every service has (the mayor has no settings of its own: its one knob is town configuration)."""
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
    missing = sorted(f"services/{name}/{module}" for name in SERVICES for module in CORE - top_level_names(ROOT / name))
    assert not missing, f"missing: {missing}"


def test_the_witness_finds_the_checkout_it_runs_from() -> None:
    # Its .tools/npm holds the Claude Code that ./dev setup installed; a module moved deeper must still find it.
    from services.witness.effects import runtime_setup

    assert (runtime_setup.PROJECT_ROOT / "pyproject.toml").is_file(), runtime_setup.PROJECT_ROOT
