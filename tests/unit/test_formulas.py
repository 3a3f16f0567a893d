"""Formulas: parsing, validation errors that name the file and the problem, cooking, and layering."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model.formulas import FormulaError, cook, parse_formula
from shared.model.formulas.catalog import BUILTIN_DIR, FormulaCatalog

GOOD = """
formula = "ship"
description = "Ship a feature"
version = 2

[vars]
feature = "widgets"
[vars.owner]
description = "who"
required = true

[[steps]]
id = "design"
title = "Design {{feature}} for {{ owner }}"
acceptance = "doc for {{feature}}"

[[steps]]
id = "build"
title = "Build {{feature}} ({{bead}})"
needs = ["design"]
description = "keep {{unknown}} literally"
"""

BUILTINS = {"bead": "hq-1", "bead_title": "Do it", "rig": "demo"}


def _problem(text: str, **kwargs: str) -> str:
    with pytest.raises(FormulaError) as info:
        parse_formula(text, source="town/ship.formula.toml", **kwargs)
    assert info.value.source == "town/ship.formula.toml"
    assert str(info.value).startswith("formula town/ship.formula.toml: ")
    return info.value.problem


def test_a_good_formula_parses_in_file_order() -> None:
    formula = parse_formula(GOOD, source="s", expected_name="ship")
    assert (formula.name, formula.version, formula.description) == ("ship", 2, "Ship a feature")
    assert [s.id for s in formula.steps] == ["design", "build"]
    assert {v.name: (v.default, v.required) for v in formula.vars} == {
        "feature": ("widgets", False),
        "owner": (None, True),
    }


def test_cooking_substitutes_defaults_builtins_and_given_vars() -> None:
    formula = parse_formula(GOOD, source="s")
    steps, used = cook(formula, {"owner": "ann"}, BUILTINS)
    assert [s.title for s in steps] == ["Design widgets for ann", "Build widgets (hq-1)"]
    assert steps[0].acceptance == "doc for widgets"
    assert steps[1].description == "keep {{unknown}} literally"  # only titles must resolve fully
    assert steps[1].needs == ["design"]
    assert used == {"feature": "widgets", "owner": "ann"}
    steps, _ = cook(formula, {"owner": "ann", "feature": "gears"}, BUILTINS)
    assert steps[0].title == "Design gears for ann"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("formula = [", "not valid TOML"),
        ('formula = "ship"\n', "at least one [[steps]]"),
        ('description = "x"\n[[steps]]\nid = "a"\ntitle = "A"\n', "`formula` is required"),
        ('formula = "Ship It"\n[[steps]]\nid = "a"\ntitle = "A"\n', "not a valid name"),
        ('formula = "ship"\nversion = 0\n[[steps]]\nid = "a"\ntitle = "A"\n', "`version`"),
        ('formula = "ship"\ncolour = "red"\n[[steps]]\nid = "a"\ntitle = "A"\n', "unknown keys colour"),
        ('formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\nneeds = "b"\n', "`needs` must be a list"),
        ('formula = "ship"\n[[steps]]\nid = "a"\n', "title` is required"),
        ('formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\nwho = "x"\n', "step 'a' has unknown keys who"),
        (
            'formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\n[[steps]]\nid = "a"\ntitle = "B"\n',
            "duplicate step id 'a'",
        ),
        ('formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\nneeds = ["ghost"]\n', "needs unknown step 'ghost'"),
        ('formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\nneeds = ["a"]\n', "needs itself"),
        (
            'formula = "ship"\n[[steps]]\nid = "a"\ntitle = "A"\nneeds = ["c"]\n'
            '[[steps]]\nid = "b"\ntitle = "B"\nneeds = ["a"]\n[[steps]]\nid = "c"\ntitle = "C"\nneeds = ["b"]\n',
            "dependency cycle: a -> c -> b -> a",
        ),
        ('formula = "ship"\n[vars.x]\nrequired = "yes"\n[[steps]]\nid = "a"\ntitle = "A"\n', "`required` must be"),
        ('formula = "ship"\ntype = "convoy"\n[[steps]]\nid = "a"\ntitle = "A"\n', "not supported"),
    ],
)
def test_a_broken_formula_is_refused_naming_the_problem(text: str, problem: str) -> None:
    assert problem in _problem(text)


def test_the_name_must_match_the_file() -> None:
    assert "named for 'other'" in _problem(GOOD, expected_name="other")


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({}, "missing required vars: owner"),
        ({"owner": ""}, "missing required vars: owner"),
        ({"owner": "a", "colour": "red"}, "unknown vars colour (the formula declares: feature, owner)"),
    ],
)
def test_cooking_refuses_bad_vars(given: dict[str, str], problem: str) -> None:
    formula = parse_formula(GOOD, source="town/ship.formula.toml")
    with pytest.raises(FormulaError) as info:
        cook(formula, given, BUILTINS)
    assert info.value.problem == problem
    assert "town/ship.formula.toml" in str(info.value)


def test_an_unresolved_placeholder_in_a_title_is_refused() -> None:
    text = 'formula = "ship"\n[[steps]]\nid = "a"\ntitle = "Do {{thing}}"\n'
    formula = parse_formula(text, source="f")
    with pytest.raises(FormulaError, match=r"step 'a': unresolved \{\{thing\}\} in its title"):
        cook(formula, {}, BUILTINS)


def test_the_builtin_formulas_are_valid_and_polecat_work_has_its_six_steps() -> None:
    catalog = FormulaCatalog(Path("/nonexistent"), Path("/nonexistent"))
    entries = catalog.entries()
    assert {"polecat-work", "code-review"} <= set(entries)
    assert all(entry.error is None for entry in entries.values())
    work = catalog.get("polecat-work")
    assert [s.id for s in work.steps] == ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]
    steps, _ = cook(work, {}, BUILTINS)
    assert steps[0].title == "Load context for hq-1: Do it"
    review, _ = cook(catalog.get("code-review"), {"change": "branch x"}, BUILTINS)
    assert review[-1].title == "Give a verdict on branch x"
    assert BUILTIN_DIR.is_dir()


def _write(directory: Path, name: str, title: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.formula.toml"
    path.write_text(f'formula = "{name}"\n[[steps]]\nid = "only"\ntitle = "{title}"\n')
    return path


def test_a_later_layer_wins_by_name(tmp_path: Path) -> None:
    town, rigs = tmp_path / "formulas", tmp_path / "rigs"
    catalog = FormulaCatalog(town, rigs)
    _write(town, "polecat-work", "town version")
    _write(town, "town-only", "t")
    _write(rigs / "demo" / "formulas", "polecat-work", "rig version")
    assert catalog.get("polecat-work").steps[0].title == "town version"
    assert catalog.get("polecat-work", rig="demo").steps[0].title == "rig version"
    assert catalog.get("polecat-work", rig="other").steps[0].title == "town version"
    assert catalog.entries(rig="demo")["polecat-work"].layer == "rig:demo"
    assert catalog.entries()["code-review"].layer == "builtin"


def test_a_broken_file_shadows_the_lower_layer_and_is_reported(tmp_path: Path) -> None:
    town = tmp_path / "formulas"
    town.mkdir()
    (town / "polecat-work.formula.toml").write_text('formula = "polecat-work"\n')
    catalog = FormulaCatalog(town, tmp_path / "rigs")
    with pytest.raises(FormulaError) as info:
        catalog.get("polecat-work")
    assert str(town / "polecat-work.formula.toml") in str(info.value)
    assert catalog.entries()["polecat-work"].error is not None


def test_an_edited_file_is_read_again_and_an_unknown_name_lists_the_known_ones(tmp_path: Path) -> None:
    town = tmp_path / "formulas"
    catalog = FormulaCatalog(town, tmp_path / "rigs")
    path = _write(town, "mine", "first")
    assert catalog.get("mine").steps[0].title == "first"
    path.write_text('formula = "mine"\n[[steps]]\nid = "only"\ntitle = "second, and longer"\n')
    assert catalog.get("mine").steps[0].title == "second, and longer"
    with pytest.raises(FormulaError, match=r"no formula named 'nope'.*known: code-review, mine, polecat-work"):
        catalog.get("nope")
