"""Why git refused the refinery's push to a target, told from git's exit code and its stderr (run with
``LC_ALL=C``, so the texts are git's English ones). Pure.

Only a target that moved (someone else pushed first) or a repository that could not be reached is worth
trying again, later and a bounded number of times. A branch checked out in a non-bare repository or a
permission refuses every push the same way (the target's doing: the rig's queue pauses); a hook may judge the
change, so its refusal fails that merge request with git's message.
"""

from __future__ import annotations

MOVED = "moved"
"""The push was not a fast-forward any more: the target moved since it was fetched."""
CHECKED_OUT = "checked_out"
"""The target is the branch checked out in a non-bare repository, and git would not update it there."""
DENIED = "denied"
"""A permission or a branch protection refused it: the target's, whatever the change."""
REFUSED = "refused"
"""A hook refused it (and anything git said that is none of the others): it may be about the change."""
UNREACHABLE = "unreachable"
"""The repository could not be read: network, a server that is down, a path that is gone, a time-out."""

RETRYABLE = frozenset({MOVED, UNREACHABLE})
TARGET_SIDE = frozenset({CHECKED_OUT, DENIED})
"""Refusals of the target itself, not of the change: every merge request would meet them, so the rig's queue
pauses (one escalation) instead of failing each merge request in turn."""

# Looked for in this order, in the lower-cased stderr: the first class with a match wins. Refusals come before
# the network texts because git adds "Could not read from remote repository" to an ssh permission refusal, and a
# branch protection before a hook because hosts report it as "protected branch hook declined".
_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        CHECKED_OUT,
        (
            "branch is currently checked out",
            "refusing to update checked out branch",
            # receive.denyCurrentBranch=updateInstead, refusing because the checkout is not clean:
            "working directory has unstaged changes",
            "working directory has staged changes",
            "could not update working tree to new head",
            "up-to-date check failed",
            "push-to-checkout hook declined",
        ),
    ),
    (
        DENIED,
        (
            "permission denied",
            "protected branch",
            "insufficient permission",
            "access denied",
            "not allowed to push",
        ),
    ),
    (REFUSED, ("hook declined",)),
    (
        MOVED,
        (
            "(non-fast-forward)",
            "(fetch first)",
            "(stale info)",
            "cannot lock ref",
            "incorrect old value provided",
        ),
    ),
    (
        UNREACHABLE,
        (
            "could not read from remote repository",
            "unable to access",
            "connection refused",
            "connection timed out",
            "connection reset",
            "could not resolve host",
            "network is unreachable",
            "no route to host",
            "the remote end hung up unexpectedly",
            "early eof",
            "timed out",
        ),
    ),
)

MESSAGE_CHARS = 2000


def classify(exit_code: int, stderr: str) -> str:
    """The class of a push that git did not complete (``exit_code`` not 0; -1: it did not finish in time)."""
    if exit_code < 0:
        return UNREACHABLE
    text = stderr.lower()
    for kind, signs in _SIGNS:
        if any(sign in text for sign in signs):
            return kind
    return REFUSED


def message(stderr: str) -> str:
    """git's message, trimmed for a person: without its hints, blank lines and padding, at most
    ``MESSAGE_CHARS`` characters (the beginning names the cause, the end the refused ref)."""
    lines = []
    for raw in stderr.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith("hint:") or not line.removeprefix("remote:").strip():
            continue
        lines.append(line)
    text = "\n".join(lines)
    if len(text) <= MESSAGE_CHARS:
        return text
    half = MESSAGE_CHARS // 2
    return f"{text[:half]}\n[...]\n{text[-half:]}"


def why(kind: str, target: str, repo: str) -> str:
    """What went wrong, in a sentence naming what to do about it."""
    if kind == CHECKED_OUT:
        return (
            f"{target} is the branch checked out in {repo}, and git would not update it there (a checkout with "
            f"uncommitted changes refuses the update): commit or stash the changes in {repo}, or point the rig at "
            "a bare repository (`git clone --bare`)"
        )
    if kind == MOVED:
        return f"{target} moved under every attempt (someone else keeps pushing to it)"
    if kind == UNREACHABLE:
        return f"the repository {repo} could not be reached"
    if kind == DENIED:
        return f"the repository {repo} refused the push (a permission or a branch protection)"
    return f"the repository {repo} refused the push (a hook, or a reason git gave that is not recognised)"
