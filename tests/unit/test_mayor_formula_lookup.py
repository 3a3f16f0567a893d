"""The mayor's decide reads no formula files: the service looks the sling's formula up in ``prepare()`` (off the
event loop) and decide cooks what it is handed in ``ctx.facts``, as the witness and deacon do their look-ups."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from services.mayor.service import MayorService
from shared.core.config import TownConfig
from shared.model.commands import BeadSling
from shared.model.decision import DecideContext
from shared.model.events import MoleculeAttached
from shared.model.formulas.catalog import FormulaCatalog
from shared.model.formulas.compile import parse_formula
from tests.mayor_town import mayor_town
from tests.memory_log import T0

CREATE = "gt.cmd.bead.create"
SMALL = """
formula = "small"
description = "two steps"
[[steps]]
id = "write"
title = "Write it"
[[steps]]
id = "check"
title = "Check it"
needs = ["write"]
"""


def _forbid_formula_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("decide read the formula files (a look-up belongs in prepare)")

    monkeypatch.setattr(FormulaCatalog, "get", refuse)
    monkeypatch.setattr(FormulaCatalog, "entries", refuse)


def test_the_service_looks_the_formula_up_in_prepare_and_decide_reads_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    town = mayor_town()
    bead = town.send(CREATE, {"title": "work"})["id"]
    service = MayorService(TownConfig(gt_home=tmp_path))
    service.projection = town.projection
    sling = BeadSling(id=bead, rig="demo")

    facts = asyncio.run(service.prepare(sling))  # reads the (built-in) formula: I/O is allowed here
    _forbid_formula_files(monkeypatch)
    ctx = DecideContext(now=T0, command_id="cmd-x", actor="operator", new_id=town.new_id, facts=facts)
    accepted = service.decide(sling, ctx)

    attached = [e.payload for e in accepted.events if isinstance(e.payload, MoleculeAttached)]
    assert [a.formula for a in attached] == ["polecat-work"]


def test_decide_cooks_the_formula_it_is_handed_with_no_catalog_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.mayor.decide import decide

    town = mayor_town()
    bead = town.send(CREATE, {"title": "work"})["id"]
    _forbid_formula_files(monkeypatch)
    formula = parse_formula(SMALL, source="test:small.toml", expected_name="small")
    ctx = DecideContext(now=T0, command_id="cmd-x", actor="operator", new_id=town.new_id)
    accepted = decide(
        town.state, BeadSling(id=bead, rig="demo", formula="small"), dataclasses.replace(ctx, facts=formula)
    )

    attached = [e.payload for e in accepted.events if isinstance(e.payload, MoleculeAttached)]
    assert [(a.formula, [s.id for s in a.steps]) for a in attached] == [("small", ["write", "check"])]
