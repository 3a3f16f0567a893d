"""Formulas as the running mayor finds them: built-in, the town's, the rig's; listed, shown, cooked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio

from shared.core.config import TownConfig
from shared.core.errors import CommandError, QueryError
from tests.drivers import NatsDriver, nats_driver


@pytest_asyncio.fixture
async def mayor(town: TownConfig) -> AsyncIterator[NatsDriver]:
    nc = await nats.connect(town.nats_url)
    try:
        async with nats_driver(town, nc) as driver:
            yield driver
    finally:
        await nc.close()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def test_the_rigs_formula_wins_over_the_towns_which_wins_over_the_builtin(
    mayor: NatsDriver, town: TownConfig
) -> None:
    write(
        town.gt_home / "formulas" / "polecat-work.formula.toml",
        'formula = "polecat-work"\n[[steps]]\nid = "town-step"\ntitle = "Town way for {{bead}}"\n',
    )
    write(
        town.gt_home / "rigs" / "web" / "formulas" / "polecat-work.formula.toml",
        'formula = "polecat-work"\nversion = 3\n[[steps]]\nid = "rig-step"\ntitle = "Web way on {{rig}}"\n',
    )
    ids = [(await mayor.send("gt.cmd.bead.create", {"title": f"b{i}"}))["id"] for i in range(3)]
    await mayor.send("gt.cmd.bead.sling", {"id": ids[0], "rig": "demo"})
    await mayor.send("gt.cmd.bead.sling", {"id": ids[1], "rig": "web"})
    demo = await mayor.ask("molecule", bead=ids[0])
    web = await mayor.ask("molecule", bead=ids[1])
    assert ([s["title"] for s in demo["steps"]], demo["source"]) == (
        [f"Town way for {ids[0]}"],
        str(town.gt_home / "formulas" / "polecat-work.formula.toml"),
    )
    assert ([s["title"] for s in web["steps"]], web["formula_version"]) == (["Web way on web"], 3)
    listed = {f["name"]: f for f in await mayor.ask("formulas", rig="web")}
    assert (listed["polecat-work"]["layer"], listed["code-review"]["layer"]) == ("rig:web", "builtin")


async def test_a_broken_formula_is_listed_with_its_error_and_a_sling_names_the_file(
    mayor: NatsDriver, town: TownConfig
) -> None:
    broken = town.gt_home / "formulas" / "loop.formula.toml"
    write(
        broken,
        'formula = "loop"\n[[steps]]\nid = "a"\ntitle = "A"\nneeds = ["b"]\n'
        '[[steps]]\nid = "b"\ntitle = "B"\nneeds = ["a"]\n',
    )
    listed = {f["name"]: f for f in await mayor.ask("formulas")}
    assert "dependency cycle" in listed["loop"]["error"]
    bead = (await mayor.send("gt.cmd.bead.create", {"title": "t"}))["id"]
    with pytest.raises(CommandError) as info:
        await mayor.send("gt.cmd.bead.sling", {"id": bead, "rig": "demo", "formula": "loop"})
    assert info.value.code == "invalid"
    assert str(broken) in info.value.message
    assert "dependency cycle: a -> b -> a" in info.value.message


async def test_show_a_formula_as_written_and_cooked_with_vars(mayor: NatsDriver) -> None:
    raw = await mayor.ask("formula", name="code-review")
    assert raw["steps"][0]["title"] == "Read {{change}}"
    assert [v["name"] for v in raw["vars"]] == ["change"]
    cooked = await mayor.ask("formula", name="code-review", vars={"change": "mr-7"})
    assert cooked["steps"][0]["title"] == "Read mr-7"
    with pytest.raises(QueryError) as info:
        await mayor.ask("formula", name="code-review", vars={"nope": "x"})
    assert "unknown vars nope" in info.value.message
    with pytest.raises(QueryError):
        await mayor.ask("formula", name="missing")
