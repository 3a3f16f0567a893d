"""The refinery merges what the polecat tested: rebasing never drops a commit of the branch because an equal
change is on the target already (git's default drops "cherry-picks" by patch id).

Found by the town chaos run: two beads each added ``FAIL_TESTS`` with their work and removed it in a fix
commit. The first landed; the second's fix commit had the same patch as the first's, git dropped it in the
rebase, and what was gated (and would have been merged) still held ``FAIL_TESTS``: the bead was sent back
forever though its branch was green.
"""

from __future__ import annotations

from shared.host import git
from tests.integration.test_refinery_batch import main_tree, settled
from tests.witness_town import PolecatTown

GATE = "test ! -e FAIL_TESTS"


def branch_with_a_fixed_failure(pt: PolecatTown, branch: str, own_file: str) -> str:
    """Work that added FAIL_TESTS, then a fix commit removing it: the branch's tip is green."""
    return pt.push_commits(
        branch,
        [{own_file: f"{own_file}\n", "FAIL_TESTS": "made to fail\n"}, {"FAIL_TESTS": None}],
    )


async def test_a_fix_commit_equal_to_one_on_the_target_is_kept_and_the_branch_lands_green(pt: PolecatTown) -> None:
    await pt.add_rig(test_command=GATE)
    first = await pt.new_bead("First, with a fixed failure", prefix="demo")
    second = await pt.new_bead("Second, with the same fix", prefix="demo")
    # Both branches start from the same main, so the second's fix is the same patch as the first's.
    head_1 = branch_with_a_fixed_failure(pt, "polecat/a/first", "first.txt")
    head_2 = branch_with_a_fixed_failure(pt, "polecat/b/second", "second.txt")

    mr_1 = await pt.submit(first, "polecat/a/first", head_1)
    assert (await settled(pt, [mr_1]))[mr_1].status == "merged"
    mr_2 = await pt.submit(second, "polecat/b/second", head_2)
    mrs = await settled(pt, [mr_2])
    assert mrs[mr_2].status == "merged", mrs[mr_2]
    assert main_tree(pt) == ["README.md", "first.txt", "second.txt"]
    assert "FAIL_TESTS" not in git.git("ls-tree", "--name-only", "main", cwd=pt.origin).split()
