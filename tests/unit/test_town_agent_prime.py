"""The commands the mayor agent's prime tells it to use (``gt mayor prime``) are real `gt` command lines: each
parses with the CLI's own parser, placeholders filled in and optional parts both left out and given."""

from __future__ import annotations

import re
import shlex

import pytest

from gt.cli.main import build_parser
from gt.cli.town_agents import COMMAND_LINES
from shared.model.session_identity import TOWN_AGENT_COMMANDS

PLACEHOLDERS = {
    "BEAD": "hq-aaaaaa",
    "RIG": "calc",
    "CONVOY": "cv-aaaaaa",
    "MESSAGE": "hq-bbbbbb",
    "ESCALATION": "esc-aaaaaa",
    "POLECAT": "ace",
    "TO": "operator",
    "N": "1",
}


def filled(line: str, *, optional: bool) -> list[list[str]]:
    """The command lines of one entry (``A   then   B`` is two), ``[...]`` parts kept or dropped, ``(...)`` notes
    dropped, placeholders filled in."""
    out = []
    for part in line.split("   then   "):
        part = re.sub(r"\s*\([^)]*\)\s*$", "", part.strip())
        part = re.sub(r"\[([^\]]*)\]", (lambda m: m.group(1)) if optional else "", part)
        part = part.replace("...", "")
        words = [PLACEHOLDERS.get(w, w) for w in shlex.split(part)]
        out.append([w for w in words if w])
    return out


def test_every_command_the_mayor_agent_may_send_has_a_line_in_its_prime() -> None:
    assert set(COMMAND_LINES) == set(TOWN_AGENT_COMMANDS)


@pytest.mark.parametrize("pair", sorted(COMMAND_LINES))
@pytest.mark.parametrize("optional", [False, True])
def test_each_line_of_its_prime_parses_as_gt_would(pair: tuple[str, str], optional: bool) -> None:
    parser = build_parser()
    for argv in filled(COMMAND_LINES[pair], optional=optional):
        assert argv[0] == "gt", argv
        parser.parse_args(argv[1:])  # SystemExit (a usage error) fails the test
