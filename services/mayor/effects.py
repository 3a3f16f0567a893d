"""The mayor's effects: reading formula files (built-in, the town's ``GT_HOME/formulas``, a rig's own). Its only
I/O besides the bus; done before deciding (``prepare()``, in a thread) so that decide stays pure."""

from __future__ import annotations

import msgspec

from services.mayor.decide.work import DEFAULT_FORMULA
from shared.core.errors import QueryError
from shared.model.commands import BeadSling
from shared.model.formulas import Formula, FormulaError, cook
from shared.model.formulas.catalog import FormulaCatalog
from shared.model.queries import mayor


def sling_formula(catalog: FormulaCatalog, cmd: BeadSling) -> Formula | FormulaError | None:
    """The formula a sling would cook onto its bead as the rig sees it now, or why there is none usable (decide
    refuses the sling with it if the bead needs a molecule); None when the sling asks for no formula."""
    if cmd.no_formula:
        return None
    try:
        return catalog.get(cmd.formula or DEFAULT_FORMULA, cmd.rig)
    except FormulaError as exc:
        return exc


def formula_list(catalog: FormulaCatalog, query: mayor.Formulas) -> list[mayor.FormulaEntry]:
    """``gt.q.mayor.formulas``: every formula the town (or ``rig``) sees, broken ones with their error."""
    out = []
    for name, entry in sorted(catalog.entries(query.rig).items()):
        item = mayor.FormulaEntry(name=name, layer=entry.layer, path=str(entry.path))
        if entry.formula is not None:
            item.description, item.version = entry.formula.description, entry.formula.version
            item.steps = len(entry.formula.steps)
        if entry.error is not None:
            item.error = str(entry.error)
        out.append(item)
    return out


def formula_view(catalog: FormulaCatalog, query: mayor.Formula) -> mayor.FormulaDetail:
    """``gt.q.mayor.formula``: one formula as written, or cooked with ``vars``."""
    name, rig, given = query.name, query.rig, query.vars
    try:
        formula = catalog.get(name, rig)
        builtins = {"bead": "<bead>", "bead_title": "<bead title>", "rig": rig or "<rig>"}
        # Without vars the steps are shown as written, placeholders and all; with them, cooked.
        steps, used = cook(formula, given, builtins) if given else (formula.steps, {})
    except FormulaError as exc:
        raise QueryError("invalid", str(exc)) from None
    return mayor.FormulaDetail(**{**msgspec.structs.asdict(formula), "steps": steps}, vars_used=used)
