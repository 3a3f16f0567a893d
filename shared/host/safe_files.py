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
def _parent_fd(root: Path, relative: PurePath, *, create: bool, owner: tuple[int, int] | None = None) -> Iterator[int]:
    """A descriptor of ``relative``'s parent, reached from ``root`` one component at a time without following a
    link (made, 0700 and given to ``owner``, when missing and ``create``)."""
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise UnsafeFileError(f"{relative} is not a path below {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in relative.parts[:-1]:
            child = _open_dir(part, fd)
            if child is None and create:
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened as it is, or refused
                    os.mkdir(part, 0o700, dir_fd=fd)
                child = _open_dir(part, fd)
                if child is not None and owner is not None:
                    os.fchown(child, *owner)
            if child is None:
                os.stat(part, dir_fd=fd, follow_symlinks=False)  # FileNotFoundError when it is simply not there
                raise UnsafeFileError(f"{root / relative}: {part} is not a directory of its own")
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_regular(name: str, flags: int, mode: int, dir_fd: int, shown: Path) -> int:
    """``name`` in ``dir_fd`` opened without following a link or blocking, as a regular file with one name (a hard
    link to someone else's file is refused: written through it, that file would change)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UnsafeFileError(f"{shown} is a link, a directory or a special file") from exc
        raise
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
        os.close(fd)
        raise UnsafeFileError(f"{shown} is not a regular file of its own")
    return fd


def write_beneath(
    root: Path, relative: PurePath | str, text: str, *, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """Write ``text`` to ``root/relative`` (made with its directories when missing), never through a link.
    ``owner``: (uid, gid) the file and directories made are given (through their descriptors)."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=True, owner=owner) as parent:
        fd = _open_regular(relative.name, os.O_WRONLY | os.O_CREAT, mode, parent, root / relative)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.ftruncate(fd, 0)  # after the checks: never a file that is not ours to write
            if owner is not None:
                os.fchown(fd, *owner)
            out.write(text)


def replace_beneath(
    root: Path, relative: PurePath | str, text: str, *, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """``write_beneath``, but a reader never sees the file half written: ``text`` goes to a new file beside it
    (``.NAME.tmp``, made afresh, never through a link), renamed over ``root/relative`` when complete."""
    relative = PurePath(relative)
    temporary = f".{relative.name}.tmp"
    with _parent_fd(root, relative, create=True, owner=owner) as parent:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=parent)  # a link or a file left there: removed, never followed
        fd = _open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, parent, root / temporary)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if owner is not None:
                os.fchown(fd, *owner)
            out.write(text)
        os.rename(temporary, relative.name, src_dir_fd=parent, dst_dir_fd=parent)


def add_lines_beneath(
    root: Path,
    relative: PurePath | str,
    lines: tuple[str, ...],
    *,
    owner: tuple[int, int] | None = None,
    as_block: bool = False,
) -> None:
    """Append to ``root/relative`` those of ``lines`` it does not hold yet (made when missing), never through a
    link. ``as_block``: the lines together, unless the file holds them so already."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=True, owner=owner) as parent:
        fd = _open_regular(relative.name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644, parent, root / relative)
        with os.fdopen(fd, "r+b") as file:
            if owner is not None and os.fstat(fd).st_size == 0:
                os.fchown(fd, *owner)
            text = file.read(DEFAULT_READ_CAP).decode(errors="replace")
            if as_block:
                block = "".join(f"{line}\n" for line in lines)
                missing = [] if block in text else list(lines)
            else:
                present = text.splitlines()
                missing = [line for line in lines if line not in present]
            if missing:
                lead = "" if not text or text.endswith("\n") else "\n"
                file.write((lead + "".join(f"{line}\n" for line in missing)).encode())


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path`` for its owner alone (0600; its directory made 0700 when missing, and kept so), never
    written through a link."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(fd, 0o600)  # made before, under another umask
        out.write(text)


def read_beneath(root: Path, relative: PurePath | str, *, cap: int = DEFAULT_READ_CAP) -> bytes:
    """Up to ``cap`` bytes of the regular file ``root/relative``, reached without following any link below
    ``root``. Raises FileNotFoundError, or UnsafeFileError."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=False) as parent:
        fd = _open_regular(relative.name, os.O_RDONLY, 0, parent, root / relative)
    with os.fdopen(fd, "rb") as file:
        return file.read(cap)


def copy_beneath(root: Path, relative: PurePath | str, dest: Path, *, cap: int = DEFAULT_READ_CAP) -> None:
    """Up to ``cap`` bytes of the regular file ``root/relative`` (reached as ``read_beneath`` reaches it) copied to
    ``dest`` (a path of the caller's own, made or truncated) by the kernel, never through this process's memory."""
    relative = PurePath(relative)
    with _parent_fd(root, relative, create=False) as parent:
        fd = _open_regular(relative.name, os.O_RDONLY, 0, parent, root / relative)
    try:
        _copy(fd, dest, cap)
    finally:
        os.close(fd)


def copy_regular(path: Path, dest: Path, *, cap: int = DEFAULT_READ_CAP) -> None:
    """Up to ``cap`` bytes of the regular file ``path`` (``open_regular``) copied to ``dest`` (``copy_beneath``)."""
    with open_regular(path) as file:
        _copy(file.fileno(), dest, cap)


COPY_CHUNK = 64 * 1024 * 1024


def _copy(source: int, dest: Path, cap: int) -> None:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        left = cap
        while left > 0:
            try:
                copied = os.copy_file_range(source, out, min(left, COPY_CHUNK))
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                copied = _copy_through_memory(source, out, min(left, COPY_CHUNK))  # a file system without it
            if copied == 0:
                return
            left -= copied
    finally:
        os.close(out)


def _copy_through_memory(source: int, out: int, most: int) -> int:
    data = os.read(source, most)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]
    return len(data)


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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
MAX_DEPTH = 400
"""How deep ``remove_tree`` goes (below it, a tree is left as it is: nothing real nests that deep)."""


def _open_dir(name: str, dir_fd: int) -> int | None:
    """A descriptor of the directory ``name`` in ``dir_fd``; None when it is gone, a link or no directory (an agent
    swapped it): never entered, never waited on."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


def _listed(fd: int) -> list[tuple[str, bool]]:
    with os.scandir(fd) as entries:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """Give ``top`` and everything under it to (uid, gid), through directory descriptors (a link at the top is
    refused; one below is changed itself, never what it names; a directory swapped for something else is not
    entered), leaving alone a regular file with more than one name (a hard link to a file of someone else's)."""
    top_fd = os.open(top, _DIR_FLAGS)
    stack = [os.dup(top_fd)]
    try:
        while stack:
            current = stack.pop()
            try:
                for name, is_dir in _listed(current):
                    try:
                        found = os.stat(name, dir_fd=current, follow_symlinks=False)
                        if stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
                            continue
                        os.chown(name, uid, gid, dir_fd=current, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if is_dir and (child := _open_dir(name, current)) is not None:
                        stack.append(child)
            finally:
                os.close(current)
        os.fchown(top_fd, uid, gid)
    finally:
        for fd in stack:
            os.close(fd)
        os.close(top_fd)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it (a link or file there: itself), through directory descriptors: no
    link followed, no FIFO waited on, read-only directories made writable (their own descriptor's mode) when this
    process is not root. What an agent adds meanwhile may be left; the caller checks."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return  # nothing there to remove
    try:
        top = _open_dir(path.name, parent)
        if top is None:
            with contextlib.suppress(OSError):
                os.unlink(path.name, dir_fd=parent)
            return
        try:
            _empty(top, 0)
        finally:
            os.close(top)
        with contextlib.suppress(OSError):
            os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def _empty(fd: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if os.geteuid() != 0:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IRWXU)
    for name, is_dir in _listed(fd):
        if is_dir and (child := _open_dir(name, fd)) is not None:
            try:
                _empty(child, depth + 1)
            finally:
                os.close(child)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
            continue
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)
