"""A work tree the full pass (``checkout --force`` and ``clean``) left at one commit, moved to another by what differs
between the two commits' trees alone: those files written or removed and their index entries updated, so the cost
follows the change, not the tree. The gate workspace moves from candidate to candidate this way, and a polecat's
released workspace to its next bead. Sound only where nothing ran in the tree since that pass (every other file is
as the pass left it), which the caller vouches for; a git run there since shows in the index's identity
(``index_stamp``). Adapter: runs git."""

from __future__ import annotations

import os
from pathlib import Path

from shared.host import git

MAX_PATHS = 2000
"""The most paths moved by alone (``fast_paths``); a larger change takes the full pass, whose cost does not grow
with the change."""
RULE_FILES = frozenset({".gitignore", ".gitattributes"})
"""Files whose change alters what the full pass does to files outside the change (which are ignored and kept, how
a file is converted): a change to one of them takes the full pass."""
SUBMODULE_MODE = "160000"

IndexStamp = tuple[int, int, int, int]


def index_stamp(index: Path) -> IndexStamp | None:
    """The identity of the index file at ``index`` (inode, size, change and modification times): any git that wrote
    it since changes it. None when there is none."""
    try:
        found = os.stat(index)
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def moved(bare: Path, work: Path, old: str, new: str) -> bool:
    """The files and index entries of the tree at ``work`` (settled at commit ``old``) made as commit ``new`` has
    them, by the two commits' tree diff (read in ``bare``, whose objects ``work`` has too: no index of the whole
    tree read for it); HEAD is the caller's to move. False, with nothing or only some of it done, when the change is
    not one moved exactly this way (the caller then takes the full pass).

    Raises:
        GitError: git failed (the caller takes the full pass).
        UnicodeError: git wrote a path that is not UTF-8.
    """
    if old == new:
        return True  # nothing changed (the base did not move since it was settled): no git run at all
    paths = fast_paths(git.tree_changes(bare, old, new))
    if paths is None:
        return False
    git.checkout_paths(work, new, paths)
    return True


def fast_paths(changes: list[git.TreeChange]) -> list[str] | None:
    """The paths to check out for ``changes``, or None when they need the full pass: too many, a type change, a
    submodule, a rule file, or a file and a directory trading places (a path added under a deleted one, or
    deleted under an added one: checking them out one by one depends on their order)."""
    if len(changes) > MAX_PATHS:
        return None
    for change in changes:
        if change.status not in ("A", "M", "D") or SUBMODULE_MODE in (change.old_mode, change.new_mode):
            return None
        if change.path.rsplit("/", 1)[-1] in RULE_FILES:
            return None
    added = {c.path for c in changes if c.status == "A"}
    deleted = {c.path for c in changes if c.status == "D"}
    if _under_any(added, deleted) or _under_any(deleted, added):
        return None
    return [change.path for change in changes]


def _under_any(paths: set[str], directories: set[str]) -> bool:
    """Whether one of ``paths`` lies under one of ``directories`` (taken as directories)."""
    for path in paths:
        parts = path.split("/")
        if any("/".join(parts[:depth]) in directories for depth in range(1, len(parts))):
            return True
    return False
