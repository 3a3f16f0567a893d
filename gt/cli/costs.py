"""`gt costs [--by bead|rig|convoy|day|session] [--json]`: token usage of polecat sessions and what it cost.

Tokens come from the mayor (``gt.q.mayor.costs``, folded from ``session.usage``); dollars from the price table
in ``GT_MODEL_PRICES`` (``shared.model.usage``), only for models it prices."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from msgspec import UNSET, UnsetType

from gt.cli import render
from gt.cli.common import Subcommands, UsageError, read_typed, show
from shared.core.config import TownConfig
from shared.model.queries import mayor
from shared.model.usage import (
    COST_GROUPINGS,
    PRICES_ENV,
    CostRow,
    ModelPrice,
    ModelUsage,
    merge,
    parse_prices,
    priced_fully,
    total_cost,
)

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    costs = sub.add_parser("costs", help="token usage and cost of polecat sessions, by bead, rig, convoy or day")
    costs.add_argument("--by", choices=COST_GROUPINGS, default="bead", help="how to group (default: bead)")
    costs.add_argument("--json", action="store_true", help="print JSON")
    costs.set_defaults(handler=_costs)


def load_prices(env: dict[str, str] | None = None) -> dict[str, ModelPrice]:
    """``GT_MODEL_PRICES``: JSON text or the path of a JSON file; unset: no prices (tokens only)."""
    value = (os.environ if env is None else env).get(PRICES_ENV, "").strip()
    if not value:
        return {}
    if not value.startswith("{"):
        try:
            value = Path(value).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{PRICES_ENV} names a file that cannot be read: {exc}") from exc
    try:
        return parse_prices(value)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


class CostLine(msgspec.Struct, kw_only=True):
    """A row of ``gt costs``: a group's tokens and what they cost (``sessions`` and ``models`` left out of the
    total's JSON)."""

    key: str
    sessions: int | UnsetType = UNSET
    models: list[ModelUsage] | UnsetType = UNSET
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    tokens: int = 0
    cost_usd: float | None = None
    """None: no model of it is priced."""
    priced: bool = True
    """False: some model of it is not priced (the cost is at least this)."""


class PricedCosts(msgspec.Struct, kw_only=True):
    """What ``gt costs --json`` prints: each row, and the total."""

    rows: list[CostLine]
    total: CostLine


def priced(rows: list[CostRow], prices: dict[str, ModelPrice]) -> PricedCosts:
    """The query's rows with tokens and cost (``cost_usd`` None where no model is priced; ``priced`` False when
    some model of the row is not), and a total row."""
    out = []
    everything: dict[str, ModelUsage] = {}
    for row in rows:
        merge(everything, row.models)
        out.append(_line(row.key, row.models, prices, sessions=row.sessions))
    return PricedCosts(rows=out, total=_line("total", list(everything.values()), prices))


def _line(
    key: str, models: list[ModelUsage], prices: dict[str, ModelPrice], *, sessions: int | UnsetType = UNSET
) -> CostLine:
    return CostLine(
        key=key,
        sessions=sessions,
        models=models if sessions is not UNSET else UNSET,
        input_tokens=sum(m.input_tokens for m in models),
        output_tokens=sum(m.output_tokens for m in models),
        cache_creation_input_tokens=sum(m.cache_creation_input_tokens for m in models),
        cache_read_input_tokens=sum(m.cache_read_input_tokens for m in models),
        tokens=sum(m.tokens for m in models),
        cost_usd=total_cost(models, prices),
        priced=priced_fully(models, prices),
    )


def money(row: CostLine) -> str:
    if row.cost_usd is None:
        return "-"
    return f"${row.cost_usd:.4f}" + ("" if row.priced else "+")


def costs_table(data: PricedCosts, by: str) -> str:
    header = (by.upper(), "INPUT", "OUTPUT", "CACHE WRITE", "CACHE READ", "TOKENS", "COST")
    rows = [
        (
            r.key,
            str(r.input_tokens),
            str(r.output_tokens),
            str(r.cache_creation_input_tokens),
            str(r.cache_read_input_tokens),
            str(r.tokens),
            money(r),
        )
        for r in [*data.rows, data.total]
    ]
    if not data.rows:
        return "no usage recorded yet (only agent runtimes that write a transcript, such as claude, record usage)"
    return render.table(header, rows, "")


async def _costs(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    prices = load_prices()
    rows = await read_typed(nc, config, mayor.Costs(by=args.by))
    return show(args, priced(rows, prices), lambda data: costs_table(data, args.by))
