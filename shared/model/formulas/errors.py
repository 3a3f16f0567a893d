"""The one error formulas raise: it names the file and the problem."""

from __future__ import annotations

from shared.core.errors import GastownError


class FormulaError(GastownError):
    """A formula cannot be used as written (or with the vars given)."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"formula {source}: {problem}")
