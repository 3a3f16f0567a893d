"""Formulas: TOML recipes of steps that are cooked onto beads as molecules."""

from shared.model.formulas.compile import BUILTIN_VARS, Formula, FormulaVar, cook, parse_formula
from shared.model.formulas.errors import FormulaError

__all__ = ["BUILTIN_VARS", "Formula", "FormulaError", "FormulaVar", "cook", "parse_formula"]
