"""argparse types shared by the command lines (``gt``, the plugins): a bad value is a usage error that says why."""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


def from_args(cls: type[S], args: argparse.Namespace, /, **given: Any) -> S:
    """``cls`` built from the parsed options named as its fields, with ``given`` over them: the one mapping from a
    command line to the command, query or settings it makes. (argparse's values are untyped, so a call spelling out
    ``field=args.field`` for each field checked nothing more.)"""
    values = {name: getattr(args, name) for name in cls.__struct_fields__ if hasattr(args, name)}
    return cls(**(values | given))


def positive_float(text: str) -> float:
    """argparse type: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a count, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


YES_NO = {"yes": True, "true": True, "no": False, "false": False}


def yes_no(text: str) -> bool:
    """argparse type: a setting turned on (``yes``, ``true``) or off (``no``, ``false``), in any case."""
    value = YES_NO.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not yes or no (yes, no, true or false)")
    return value
