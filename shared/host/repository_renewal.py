"""A workspace kept for its next user with its repository made anew: the files stay (a checkout then moves them by
what changed, not by the size of the tree), nothing of the last user's ``.git`` does.

A workspace's last user (a polecat's agent, a gate) could write anything in its ``.git``: config naming filters or
an fsmonitor, hooks, a ``commondir`` pointing elsewhere, loose objects that claim the id of a blob the next
checkout writes, an index whose entries it forged so a file it changed looks unchanged. So the repository is
replaced whole by one made by the service, holding only what the service wrote itself: its config, its
alternates, and the **trusted index**, the index as git wrote it right after the service's own checkout, before
the last user started (``read_index``). A file the last user changed since has another ctime than that index
records, which nobody can set: the next checkout compares it by content and writes it again. Adapter: file I/O,
runs git.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from shared.host import git, safe_files

INDEX_MAX_BYTES = 512 * 1024 * 1024
"""The largest index read back as trusted: far more than a 1,000,000-file tree needs."""


def read_index(work: Path) -> bytes:
    """The index of the workspace at ``work``, read without following a link: to be kept as the trusted index, right
    after the service's own checkout and before anyone else runs in it."""
    return safe_files.read_beneath(work, ".git/index", cap=INDEX_MAX_BYTES)


def keep_index(work: Path, dest: Path) -> None:
    """``read_index`` kept in the file ``dest`` (the service's own), copied by the kernel."""
    safe_files.copy_beneath(work, ".git/index", dest, cap=INDEX_MAX_BYTES)


def renew(
    work: Path,
    *,
    scratch: Path,
    alternates: Path,
    trusted_index: bytes | Path,
    owner: tuple[int, int] | None,
    configure: Callable[[Path], None] = lambda _repo: None,
) -> None:
    """Replace ``work/.git`` by a new repository: made in ``scratch`` (a directory of the service's on the same file
    system), borrowing ``alternates`` (an objects directory), given ``trusted_index`` (its bytes, or a file of the
    service's that holds it: copied by the kernel) and whatever ``configure``
    (called with the new repository's work directory) sets, handed to ``owner`` (uid, gid) and moved in. The
    caller then checks out (``git checkout --force``) and cleans.

    Raises:
        GitError: git could not make the repository.
        OSError: ``work`` is not a directory of its own (a link), or the swap failed.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    temp = scratch / f".renew-{uuid.uuid4().hex[:12]}"
    try:
        git.git("init", "--quiet", str(temp))
        repo = temp / ".git"
        (repo / "objects" / "info" / "alternates").write_text(f"{alternates.resolve()}\n")
        configure(temp)
        if isinstance(trusted_index, Path):
            safe_files.copy_regular(trusted_index, repo / "index", cap=INDEX_MAX_BYTES)
        else:
            (repo / "index").write_bytes(trusted_index)
        if owner is not None:
            safe_files.chown_tree(repo, *owner)
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        # The old repository goes to the scratch directory (the service's), never left in the work tree: what
        # cannot be removed of it (a tree deeper than anything walks) stays out of the next user's way.
        old = temp / "old-git"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.rename(".git", old, src_dir_fd=fd)
            os.rename(repo, ".git", dst_dir_fd=fd)
        finally:
            os.close(fd)
    finally:
        git.force_remove(temp)
