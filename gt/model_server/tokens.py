"""Token counts and usage, estimated the same way for every dialect. Pure.

Usage is kept in the Anthropic API's four fields (``input_tokens``, ``cache_creation_input_tokens``,
``cache_read_input_tokens``, ``output_tokens``: ``shared.model.usage.TOKEN_FIELDS``, what the witness records);
each dialect reports it in its own words."""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4
"""The estimate of tokens from characters (the usual rule of thumb for English and code)."""
UNCACHED_TAIL_TOKENS = 3
"""Input tokens after the last cache breakpoint (Claude Code marks its newest message, so only a few remain)."""


def estimate_tokens(value: Any) -> int:
    """A deterministic token count of a JSON value: its compact JSON length over CHARS_PER_TOKEN, at least 1."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return max(1, len(text) // CHARS_PER_TOKEN)


def usage(total_input: int, cached_before: int, output_tokens: int, *, cache: bool) -> dict[str, int]:
    """A usage block. With caching, what an earlier request of the session already sent is read from the cache,
    the rest is written to it, and a few tokens after the last breakpoint are plain input; without, everything is
    plain input."""
    if not cache:
        return {
            "input_tokens": total_input,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        }
    read = min(cached_before, total_input)
    return {
        "input_tokens": UNCACHED_TAIL_TOKENS,
        "cache_creation_input_tokens": total_input - read,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }


def all_input(usage_block: dict[str, int]) -> int:
    """Every input token of a usage block, cached or not (what OpenAI's and Gemini's APIs call the prompt)."""
    return (
        usage_block["input_tokens"]
        + usage_block["cache_creation_input_tokens"]
        + usage_block["cache_read_input_tokens"]
    )
