"""Finding formulas on disk: built-in, then the town's, then the rig's; a later layer wins by name.

The only formula module that reads files. Parsed files are cached by modification time, so a changed
formula is picked up on its next use and an unchanged one costs a ``stat``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shared.core.trusted_files import trust_problem
from shared.model.events.molecules import CiGate
from shared.model.formulas.compile import Formula, parse_formula
from shared.model.formulas.errors import FormulaError

BUILTIN_DIR = Path(__file__).parent / "builtin"
SUFFIX = ".formula.toml"
DEFAULT_FORMULA = "polecat-work"


@dataclass(frozen=True, slots=True)
class FormulaEntry:
    """One formula as found: where, from which layer, and either its parsed form or what is wrong."""

    name: str
    path: Path
    layer: str
    formula: Formula | None
    error: FormulaError | None


class FormulaCatalog:
    """Formulas under ``town_dir`` and ``rigs_dir/<rig>/formulas``, over the built-in ones."""

    def __init__(self, town_dir: Path, rigs_dir: Path, *, builtin_dir: Path = BUILTIN_DIR) -> None:
        self._layers = (("builtin", builtin_dir), ("town", town_dir))
        self._rigs_dir = rigs_dir
        self._cache: dict[Path, tuple[int, int, Formula | FormulaError]] = {}

    def rig_dir(self, rig: str) -> Path:
        return self._rigs_dir / rig / "formulas"

    def entries(self, rig: str | None = None) -> dict[str, FormulaEntry]:
        """Every visible formula by name (the winning layer's), broken ones included."""
        layers = list(self._layers)
        if rig:
            layers.append((f"rig:{rig}", self.rig_dir(rig)))
        found: dict[str, FormulaEntry] = {}
        for layer, directory in layers:
            for path in _formula_files(directory):
                name = path.name.removesuffix(SUFFIX)
                parsed = self._parse(path, name)
                if isinstance(parsed, FormulaError):
                    found[name] = FormulaEntry(name, path, layer, None, parsed)
                else:
                    found[name] = FormulaEntry(name, path, layer, parsed, None)
        return found

    def get(self, name: str, rig: str | None = None) -> Formula:
        """The formula ``name`` as the rig sees it.

        Raises:
            FormulaError: there is none, or the winning file is broken (a broken file is never skipped
                in favour of a lower layer's: that would run something other than what was written).
        """
        entry = self.entries(rig).get(name)
        if entry is None:
            known = ", ".join(sorted(self.entries(rig))) or "none"
            where = f" for rig {rig}" if rig else ""
            raise FormulaError(name, f"no formula named {name!r}{where} (known: {known})")
        if entry.error is not None:
            raise entry.error
        assert entry.formula is not None
        return entry.formula

    def _parse(self, path: Path, name: str) -> Formula | FormulaError:
        try:
            stat = path.stat()
        except OSError as exc:
            return FormulaError(str(path), f"cannot be read: {exc}")
        cached = self._cache.get(path)
        if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        source = f"builtin:{path.name}" if path.parent == BUILTIN_DIR else str(path)
        result: Formula | FormulaError
        try:
            result = parse_formula(path.read_text(encoding="utf-8"), source=source, expected_name=name)
            if path.parent != BUILTIN_DIR and any(isinstance(step.wait, CiGate) for step in result.steps):
                # Its CI check runs as a command of the town's: only from a file nobody else could have written.
                problem = trust_problem(path.parent, "formula directory") or trust_problem(path, "formula file")
                if problem is not None:
                    result = FormulaError(source, f"has a ci gate, and it is {problem}")
        except FormulaError as exc:
            result = exc
        except (OSError, UnicodeDecodeError) as exc:
            result = FormulaError(source, f"cannot be read: {exc}")
        self._cache[path] = (stat.st_mtime_ns, stat.st_size, result)
        return result


def _formula_files(directory: Path) -> list[Path]:
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.name.endswith(SUFFIX))
    except OSError:
        return []
    return [directory / name for name in names]
