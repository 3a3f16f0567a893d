"""The umask every entry point sets (shared.host.privacy.private_files): 077 unless GT_UMASK says otherwise."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shared.host.privacy import private_files


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_files_are_private_by_default() -> None:
    assert private_files({}) == 0o077
    assert current_umask() == 0o077


def test_gt_umask_shares_with_a_group_when_asked() -> None:
    assert private_files({"GT_UMASK": "007"}) == 0o007
    assert current_umask() == 0o007


@pytest.mark.parametrize("value", ["rw", "999", "0o7777", "-1", "1000"])
def test_a_bad_gt_umask_is_refused_naming_it_and_changes_nothing(value: str) -> None:
    with pytest.raises(ValueError, match="GT_UMASK"):
        private_files({"GT_UMASK": value})
    assert current_umask() == 0o022
