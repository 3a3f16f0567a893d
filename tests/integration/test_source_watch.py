"""The client helper's watch on the code it imported (gt/cli/sources.py): every change that could make a call run
old code is seen, in the helper and in each worker forked from it; reading the code is not a change."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from gt.cli import sources
from gt.cli.sources import SourceWatch


def _package(root: Path) -> dict[str, int]:
    pkg = root / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    for name in ("__init__.py", "render.py"):
        (pkg / name).write_text("X = 1\n")
    return {str(p): p.stat().st_mtime_ns for p in pkg.glob("*.py")}


@pytest.fixture(params=["inotify", "modification times"])
def watch_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "modification times":
        monkeypatch.setattr(sources, "_watch", lambda _directories: None)
    return str(request.param)


def _watch(root: Path, kind: str) -> SourceWatch:
    watch = SourceWatch(_package(root))
    assert watch.watching == (kind == "inotify")
    return watch


def test_reading_the_code_or_writing_its_bytecode_is_no_change(tmp_path: Path, watch_kind: str) -> None:
    watch = _watch(tmp_path, watch_kind)
    for path in (tmp_path / "pkg").glob("*.py"):
        path.read_bytes()
    (tmp_path / "pkg" / "__pycache__" / "render.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert not watch.changed()


def test_a_file_edited_in_place_is_a_change(tmp_path: Path, watch_kind: str) -> None:
    watch = _watch(tmp_path, watch_kind)
    source = tmp_path / "pkg" / "render.py"
    before = source.stat()
    with source.open("w") as out:
        out.write("X = 2\n")
    if watch_kind == "inotify":
        # Even with its modification time put back, which comparing times cannot see.
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert watch.changed()
    assert watch.changed()  # and it stays so


def test_a_file_replaced_as_an_installer_does_is_a_change(tmp_path: Path, watch_kind: str) -> None:
    watch = _watch(tmp_path, watch_kind)
    fresh = tmp_path / "pkg" / "render.py.new"
    fresh.write_text("X = 3\n")
    os.utime(fresh, ns=(0, 1_000_000_000))  # an installer keeps the archive's times: an old one, here
    fresh.replace(tmp_path / "pkg" / "render.py")
    assert watch.changed()


def test_a_removed_file_is_a_change(tmp_path: Path, watch_kind: str) -> None:
    watch = _watch(tmp_path, watch_kind)
    (tmp_path / "pkg" / "render.py").unlink()
    assert watch.changed()


def test_a_change_made_before_the_watch_began_is_seen(tmp_path: Path) -> None:
    known = _package(tmp_path)
    source = tmp_path / "pkg" / "render.py"
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 1_000_000_000))  # after the times were read
    watch = SourceWatch(known)
    assert watch.watching
    assert watch.changed()


def test_a_change_is_seen_by_every_process_forked_from_the_watcher(tmp_path: Path) -> None:
    """The helper makes the watch and forks its workers: one worker seeing a change must not hide it from
    the others (nobody reads the events, so the watch stays readable)."""
    watch = _watch(tmp_path, "inotify")
    (tmp_path / "pkg" / "render.py").write_text("X = 4\n")
    seen = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if watch.changed() else 1)
        _, status = os.waitpid(pid, 0)
        seen.append(os.waitstatus_to_exitcode(status) == 0)
    assert seen == [True, True]
    assert watch.changed()


def test_the_helper_watches_what_it_imported_from_outside_the_standard_library() -> None:
    known = sources.imported()
    assert sources.__file__ in known
    assert os.__file__ not in known  # the standard library changes only with the interpreter
    site_packages = str(Path(msgspec.__file__).parent.parent)
    assert msgspec.__file__ in known
    assert site_packages in known  # a package installed there or removed, beside those imported
