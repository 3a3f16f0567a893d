"""``python -m gt.model_server.demo_story WORKTREE``: the scripts file ``./dev demo`` serves, printed as JSON.

Two polecats' sessions, told as the stories the scripted model makes the demo's agents act out side by side:

- Claude Code in the ``--agent claude`` rig (``demo-polecat``, the file's first script, the server's default):
  read its hook with ``gt prime``, write a user guide with Claude Code's own Write tool and correct it with its
  Edit tool, commit it with git, mark every step of the polecat-work molecule done and submit the branch with
  ``gt done``. ``WORKTREE`` is the polecat's worktree (Claude Code's Write and Edit take absolute paths).
- Codex CLI, the runtime one bead is slung with (``demo-codex``, served to requests with Codex's API key): the
  same steps for a changelog, its file written with Codex's shell tool (a relative path: its commands run in the
  worktree, whichever polecat it is).
"""

from __future__ import annotations

import sys

import msgspec

from gt.model_server.script import Script, bash, edit, say, use, write

GUIDE = "USAGE.md"
CHANGELOG = "CHANGELOG.md"
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


def changelog_story(*, name: str = "demo-codex") -> Script:
    return Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), text="Reading my hook."),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(write(CHANGELOG, "# Changelog\n\n## 0.1.0\n\n- The frobulator frobulates.\n"), text="A changelog."),
            use(
                bash(
                    f"gt step done implement && git add {CHANGELOG} && git commit -q -m 'docs: a changelog' && "
                    "gt step done commit && gt step done self-review && gt step done run-tests",
                    expect="run-tests: done",
                )
            ),
            use(bash("gt step done submit && gt done", expect="merge request"), text="Submitting my branch."),
            say("The changelog is in the merge queue."),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gt.model_server.demo_story WORKTREE", file=sys.stderr)
        return 2
    sys.stdout.write(msgspec.json.encode([demo_story(args[0]), changelog_story()]).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
