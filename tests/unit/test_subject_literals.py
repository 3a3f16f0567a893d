"""No subject is spelled out in the code outside the modules that define subjects: a command's subject comes from its
type (``BeadClose.SUBJECT``, in ``shared/model/commands``), a query's from its type (``shared/model/queries``), an
event's and everything else from the functions of ``shared/core/subjects.py`` (docs/architecture.md, "Sending a command
and asking a query"). A renamed subject then changes in one place, and a typo is an import error, not a message nobody
reads.

Every string in the code counts (f-strings' parts too), wherever the subject stands in it; docstrings do not (the
syntax tree tells them apart), nor do comments (they are not in it)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("shared", "services", "gt", "bench")
DEFINE_SUBJECTS = ("shared/core/subjects.py", "shared/model/commands/")
"""Where subjects are written down: the grammar, and each command type's ``SUBJECT``."""
SUBJECT = re.compile(r"(?<![\w.])gt\.(?:cmd|q|evt)(?!\w)")


def docstrings(tree: ast.AST) -> set[int]:
    """Ids of the string nodes that are a module's, class's or function's docstring."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in node.body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(id(statement.value))
    return found


def subject_literals(source: str, where: str) -> Iterator[str]:
    """``where:line: text`` of each string in ``source`` that spells out a subject."""
    tree = ast.parse(source, filename=where)
    skipped = docstrings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skipped:
            continue
        if SUBJECT.search(node.value):
            yield f"{where}:{node.lineno}: {node.value[:80]!r}"


def test_no_subject_literal_outside_the_modules_that_define_subjects() -> None:
    found: list[str] = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if not where.startswith(DEFINE_SUBJECTS):
                found += subject_literals(path.read_text(encoding="utf-8"), where)
    assert found == [], "build subjects from the command's or query's type, or with shared/core/subjects.py"


def test_the_scan_sees_every_kind_of_literal_and_skips_docstrings_and_comments() -> None:
    # The guard would pass vacuously if the scan missed f-strings, or took prose for subjects.
    source = '''
"""Module docstring naming gt.cmd.bead.create."""
# a comment naming gt.evt.bead.<id>
PLAIN = "gt.cmd.bead.create"
BUILT = f"gt.q.{service}.status"
INSIDE = f"refused: send {verb} on gt.evt.lease.{name} instead"


def f() -> None:
    """A docstring naming gt.q.mayor.get."""
    return "gt.cmd"


OTHERS = ("gt.plugin.x", "x.gt.cmd.y", "gt.cmdx", "gt", "evt")
'''
    assert [line.split(": ", 1)[0] for line in subject_literals(source, "x.py")] == [
        "x.py:4",
        "x.py:5",
        "x.py:6",
        "x.py:11",
    ]
