"""Names that reach git and text typed into panes (issue 20, points 2 and 8): pure checks."""

from __future__ import annotations

import pytest

from shared.core.errors import CommandError
from shared.host.tmux import typeable
from shared.model.commands.rigs import check_branch


@pytest.mark.parametrize("name", ["main", "polecat/ace/demo-1", "release/1.0", "feature_x-2", "v1.2.3"])
def test_branch_names_git_takes_as_names_pass(name: str) -> None:
    check_branch("branch", name)


@pytest.mark.parametrize(
    "name",
    ["-x", "--upload-pack=touch /tmp/x", "--delete", "a/../b", "/abs", ".hidden", "a//b", "a/", "x.lock", "a@{1}",
     "sp ace", "", "a\nb", "x" * 201],
)  # fmt: skip
def test_names_git_would_misread_are_invalid(name: str) -> None:
    with pytest.raises(CommandError) as caught:
        check_branch("branch", name)
    assert caught.value.code == "invalid"
    assert "`branch`" in caught.value.message


def test_typed_text_keeps_no_control_character() -> None:
    assert typeable("stop\x03 now \x1b[31mred\x1b[0m\x07\x7f\x9b") == "stop now [31mred[0m"
    assert typeable("a\tb\nc\rd") == "a bcd"
    assert typeable("plain: `gt mail read hq-1`") == "plain: `gt mail read hq-1`"
