"""``python -m gt.model_server SCRIPTS.json [--port N] [--key KEY=SCRIPT ...]``: serve scripts from a JSON file
until interrupted.

The file holds a list of scripts (``{"name": ..., "turns": [...], "faults": [...]}``, the fields of
``gt.model_server.script.Script``); the first is the default for requests that name none. ``--key`` answers
requests made with that API key from that script (one runtime's sessions one story, another's another: each
runtime sends its own vendor's key). The first line printed is ``{"base_url": "http://127.0.0.1:<port>"}`` (port 0
picks a free one), for a script to read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

import msgspec

from gt.model_server.script import Script
from gt.model_server.server import ModelServer


async def _serve(scripts: list[Script], port: int, keys: dict[str, str]) -> None:
    server = ModelServer(scripts, keys=keys, default=scripts[0].name if scripts else None)
    await server.start(port=port)
    print(json.dumps({"base_url": server.base_url}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gt.model_server", description=__doc__)
    parser.add_argument("scripts", type=Path, help="a JSON file: a list of scripts")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--key", action="append", default=[], metavar="KEY=SCRIPT", help="requests with this API key get that script"
    )
    args = parser.parse_args(argv)
    keys = dict(pair.rsplit("=", 1) for pair in args.key if "=" in pair)
    try:
        scripts = msgspec.json.decode(args.scripts.read_bytes(), type=list[Script])
    except (OSError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"model_server: cannot read scripts from {args.scripts}: {exc}", file=sys.stderr)
        return 2
    unknown = sorted({*keys.values()} - {script.name for script in scripts})
    if len(keys) != len(args.key) or unknown:
        print(f"model_server: --key takes KEY=SCRIPT, SCRIPT one of the file's; got {args.key}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(scripts, args.port, keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
