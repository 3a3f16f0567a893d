"""The deacon reads only automation files that nobody but its own OS user or root could have written (like sshd's
StrictModes): the red-team's W2, an agent dropping a file into the automations directory of the shared GT_HOME,
is refused by name and reason, never run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.deacon.automations import queries
from services.deacon.automations.definitions import AutomationCatalog, InvalidAutomation
from services.deacon.automations.state import AutomationState
from shared.core.trusted_files import trust_problem

BODY = '[automation]\ngate = "manual"\nexec = "true"\n'
OTHER_UID = 54321
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    old = os.umask(0o022)
    try:
        path = tmp_path / "automations"
        path.mkdir(mode=0o755)
        yield path
    finally:
        os.umask(old)


def write(directory: Path, name: str, mode: int = 0o644) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(BODY)
    path.chmod(mode)
    return path


def refused(catalog: AutomationCatalog, name: str) -> InvalidAutomation:
    broken = catalog.load().invalid[name]
    assert broken.refused, broken
    return broken


def test_a_file_of_the_deacons_own_user_not_writable_by_others_is_read(directory: Path) -> None:
    write(directory, "nightly", 0o600)
    write(directory, "report", 0o644)
    assert sorted(AutomationCatalog(directory).load().automations) == ["nightly", "report"]


@pytest.mark.parametrize(("mode", "who"), [(0o664, "group"), (0o646, "others"), (0o666, "group and others")])
def test_a_file_others_may_write_is_refused_and_the_others_still_load(directory: Path, mode: int, who: str) -> None:
    write(directory, "nightly")
    dropped = write(directory, "dropped", mode)
    catalog = AutomationCatalog(directory)
    broken = refused(catalog, "dropped")
    assert broken.problem.startswith(f"refused: the file {dropped} is writable by {who} (mode {mode:03o})")
    assert "chmod go-w" in broken.problem
    assert list(catalog.load().automations) == ["nightly"]


def test_a_directory_others_may_write_refuses_every_file_in_it(directory: Path) -> None:
    write(directory, "nightly")
    directory.chmod(0o777)
    broken = refused(AutomationCatalog(directory), "nightly")
    assert f"the directory {directory} is writable by group and others" in broken.problem


@as_root
def test_a_file_another_user_owns_is_refused_naming_the_owner(directory: Path) -> None:
    dropped = write(directory, "dropped")
    os.chown(dropped, OTHER_UID, OTHER_UID)
    broken = refused(AutomationCatalog(directory), "dropped")
    assert broken.problem.startswith(
        f"refused: the file {dropped} is owned by uid {OTHER_UID}, "
        f"not by the town's services' user (uid {os.geteuid()}) "
        "or root"
    )
    assert broken.message == f"automation file {dropped}: {broken.problem}"


@as_root
def test_a_directory_another_user_owns_is_refused(directory: Path) -> None:
    write(directory, "nightly")
    os.chown(directory, OTHER_UID, OTHER_UID)
    assert (
        f"the directory {directory} is owned by uid {OTHER_UID}"
        in refused(AutomationCatalog(directory), "nightly").problem
    )


@as_root
def test_a_link_to_a_file_another_user_owns_is_refused(directory: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "agent.toml"
    elsewhere.write_text(BODY)
    os.chown(elsewhere, OTHER_UID, OTHER_UID)
    (directory / "linked.toml").symlink_to(elsewhere)
    assert "owned by uid" in refused(AutomationCatalog(directory), "linked").problem


def test_a_chmod_alone_is_seen_at_the_next_load(directory: Path) -> None:
    path = write(directory, "nightly")
    catalog = AutomationCatalog(directory)
    assert list(catalog.load().automations) == ["nightly"]  # parsed and cached
    path.chmod(0o666)
    assert refused(catalog, "nightly")
    path.chmod(0o644)
    assert list(catalog.load().automations) == ["nightly"]


def test_gt_automation_list_shows_a_refused_file_with_why(directory: Path) -> None:
    write(directory, "dropped", 0o666)
    defs = AutomationCatalog(directory).load()
    [view] = queries.list_view(defs, AutomationState(), {}, datetime.now(UTC))
    assert (view.name, view.status) == ("dropped", "invalid")
    assert "refused: the file" in (view.error or "")


def test_an_unreadable_path_is_left_to_the_reader(tmp_path: Path) -> None:
    assert trust_problem(tmp_path / "missing.toml", "file") is None
