"""``python -m gt.model_server.demo_story WORKTREE``: the scripts file ``./dev demo`` serves, printed as JSON.

One polecat's session, told as the story the scripted model makes Claude Code act out in the demo's ``--agent
claude`` rig: read its hook with ``gt prime``, write a user guide with Claude Code's own Write tool and correct it
with its Edit tool, commit it with git, mark every step of the polecat-work molecule done and submit the branch
with ``gt done``. ``WORKTREE`` is the polecat's worktree (Claude Code's Write and Edit take absolute paths).
The script is the file's first, so it is the server's default: the demo's sessions need not name it.
"""

from __future__ import annotations

import sys

import msgspec

from gt.model_server.script import Script, bash, edit, say, use, write

GUIDE = "USAGE.md"
DRAFT = "# The frobulator\n\nTODO: say how to run it.\n"


def demo_story(worktree: str, *, name: str = "demo-polecat") -> Script:
    guide = f"{worktree.rstrip('/')}/{GUIDE}"
    return Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), text="Let me read my hook first."),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(write(guide, DRAFT), text="Writing the frobulator's user guide."),
            use(
                edit(guide, "TODO: say how to run it.", "Run `frobulate --help` for its options.", expect="updated"),
                text="Replacing the TODO with real instructions.",
            ),
            use(bash("gt step done implement", expect="implement: done")),
            use(bash(f"git add {GUIDE} && git commit -q -m 'docs: a user guide for the frobulator'")),
            use(
                bash(
                    "gt step done commit && gt step done self-review && gt step done run-tests",
                    expect="run-tests: done",
                )
            ),
            use(bash("gt step done submit && gt done", expect="merge request"), text="Submitting my branch."),
            say("The user guide is in the merge queue. Done."),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gt.model_server.demo_story WORKTREE", file=sys.stderr)
        return 2
    sys.stdout.write(msgspec.json.encode([demo_story(args[0])]).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
