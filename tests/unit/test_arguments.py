"""A command line's parsed options to the struct they make (``from_args``), and the argparse types."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import msgspec
import pytest

from shared.core.arguments import from_args, non_negative_int, positive_float, yes_no


class Made(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    count: int = 1
    note: str | None = None


def test_options_named_as_fields_fill_them_and_others_are_not_read() -> None:
    args = argparse.Namespace(name="a", count=3, json=True, handler=print)
    assert from_args(Made, args) == Made(name="a", count=3)


def test_given_values_win_over_the_options() -> None:
    args = argparse.Namespace(name="a", count=3, note="from the line")
    assert from_args(Made, args, count=7, note=None) == Made(name="a", count=7, note=None)


def test_a_field_no_option_names_keeps_its_default() -> None:
    assert from_args(Made, argparse.Namespace(name="a")) == Made(name="a")


def test_a_required_field_no_option_or_given_value_names_is_an_error() -> None:
    with pytest.raises(TypeError, match="name"):
        from_args(Made, argparse.Namespace(count=2))


@pytest.mark.parametrize(("parse", "text"), [(positive_float, "0"), (positive_float, "x"), (non_negative_int, "-1")])
def test_an_out_of_range_value_is_a_usage_error_saying_why(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "value"), [("yes", True), ("true", True), ("YES", True), ("no", False), ("false", False), (" No ", False)]
)
def test_yes_no_takes_yes_no_true_and_false_in_any_case(text: str, value: bool) -> None:
    assert yes_no(text) is value


@pytest.mark.parametrize("text", ["maybe", "", "1", "y", "on"])
def test_yes_no_refuses_anything_else_saying_what_it_takes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"is not yes or no \(yes, no, true or false\)"):
        yes_no(text)
