"""Files in directories an agent can write (its workspace, its runtime dir), read and written by a service without
following the agent's links or blocking on its special files.

An agent owns those directories: between a service's check and its use it can put a symlink where a file was (a
root service writing through it writes wherever the agent chose: /etc/ld.so.preload), a directory where a bundle
was, or a FIFO where its hook log was (an ``open`` that never returns freezes the service). So every component
below the directory the service trusts is opened with ``O_NOFOLLOW`` relative to its parent's descriptor, the last
one must be a regular file (``fstat``), it is opened ``O_NONBLOCK`` and read up to a cap. Adapter: file I/O.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import BinaryIO

DEFAULT_READ_CAP = 16 * 1024 * 1024
"""What ``read_regular`` reads at most by default: more than any hook log or failure record holds."""


class UnsafeFileError(OSError):
    """A path below a trusted directory is a link, a special file, or the wrong kind of thing."""


@contextlib.contextmanager
def _parent_fd(root: Path, relative: PurePath, *, create: bool) -> Iterator[int]:
    """A descriptor of ``relative``'s parent, reached from ``root`` one component at a time without following a
    link (made, 0700, when missing and ``create``)."""
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise UnsafeFileError(f"{relative} is not a path below {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in relative.parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise UnsafeFileError(f"{root / relative}: {part} is not a directory of its own ({exc})") from exc
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_regular(name: str, flags: int, mode: int, dir_fd: int, shown: Path) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafeFileError(f"{shown} is a link or a special file") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{shown} is not a regular file")
    return fd


def write_beneath(
    root: Path, relative: PurePath | str, text: str, *, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """Write ``text`` to ``root/relative`` (made with its directories when missing), never through a link.
    ``owner``: (uid, gid) the file is given (its descriptor's, so no link is followed either)."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=True) as parent:
        fd = _open_regular(relative.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, parent, root / relative)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if owner is not None:
                os.fchown(fd, *owner)
            out.write(text)


def add_lines_beneath(
    root: Path, relative: PurePath | str, lines: tuple[str, ...], *, owner: tuple[int, int] | None = None
) -> None:
    """Append to ``root/relative`` those of ``lines`` it does not hold yet (made when missing), never through a
    link."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=True) as parent:
        fd = _open_regular(relative.name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644, parent, root / relative)
        with os.fdopen(fd, "r+b") as file:
            if owner is not None and os.fstat(fd).st_size == 0:
                os.fchown(fd, *owner)
            present = file.read(DEFAULT_READ_CAP).decode(errors="replace").splitlines()
            missing = [line for line in lines if line not in present]
            if missing:
                file.write("".join(f"{line}\n" for line in missing).encode())


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[BinaryIO]:
    """The regular file ``path`` open for reading (its last component never followed, never blocking on a FIFO or a
    device). Raises FileNotFoundError, or UnsafeFileError for a link or a special file."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _open_regular(path.name, os.O_RDONLY, 0, parent, path)
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb") as file:
        yield file


def read_regular(path: Path, *, cap: int = DEFAULT_READ_CAP) -> bytes:
    """Up to ``cap`` bytes of the regular file ``path`` (``open_regular``)."""
    with open_regular(path) as file:
        return file.read(cap)
