"""`gt costs [--by bead|rig|convoy|day|session] [--json]`: token usage of polecat sessions and what it cost.

Tokens come from the mayor (``gt.q.mayor.costs``, folded from ``session.usage``); dollars from the price table
in ``GT_MODEL_PRICES`` (``shared.model.usage``), only for models it prices."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gt.cli import render
from gt.cli.common import Subcommands, UsageError, read, show
from shared.core.config import TownConfig
from shared.model.queries import mayor
from shared.model.usage import (
    COST_GROUPINGS,
    PRICES_ENV,
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


def priced(rows: list[dict[str, Any]], prices: dict[str, ModelPrice]) -> dict[str, Any]:
    """The query's rows with tokens and cost (``cost_usd`` None where no model is priced; ``priced`` False when
    some model of the row is not), and a total row."""
    out = []
    everything: dict[str, ModelUsage] = {}
    for row in rows:
        models = [msgspec.convert(m, ModelUsage) for m in row.get("models") or []]
        merge(everything, models)
        out.append({**row, **_sums(models, prices)})
    return {"rows": out, "total": {"key": "total", **_sums(list(everything.values()), prices)}}


def _sums(models: list[ModelUsage], prices: dict[str, ModelPrice]) -> dict[str, Any]:
    return {
        "input_tokens": sum(m.input_tokens for m in models),
        "output_tokens": sum(m.output_tokens for m in models),
        "cache_creation_input_tokens": sum(m.cache_creation_input_tokens for m in models),
        "cache_read_input_tokens": sum(m.cache_read_input_tokens for m in models),
        "tokens": sum(m.tokens for m in models),
        "cost_usd": total_cost(models, prices),
        "priced": priced_fully(models, prices),
    }


def money(row: dict[str, Any]) -> str:
    cost = row.get("cost_usd")
    if cost is None:
        return "-"
    return f"${cost:.4f}" + ("" if row.get("priced") else "+")


def costs_table(data: dict[str, Any], by: str) -> str:
    header = (by.upper(), "INPUT", "OUTPUT", "CACHE WRITE", "CACHE READ", "TOKENS", "COST")
    rows = [
        (
            str(r["key"]),
            str(r["input_tokens"]),
            str(r["output_tokens"]),
            str(r["cache_creation_input_tokens"]),
            str(r["cache_read_input_tokens"]),
            str(r["tokens"]),
            money(r),
        )
        for r in [*data["rows"], data["total"]]
    ]
    if not data["rows"]:
        return "no usage recorded yet (only agent runtimes that write a transcript, such as claude, record usage)"
    return render.table(header, rows, "")


async def _costs(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    prices = load_prices()
    rows = await read(nc, config, mayor.Costs(by=args.by))
    return show(args, priced(rows, prices), lambda data: costs_table(data, args.by))
