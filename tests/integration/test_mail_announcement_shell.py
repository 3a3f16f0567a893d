"""A mail's announcement is typed into the addressee's pane, and an agent may be a shell that runs what is typed:
the line runs nothing in bash (as a command string and typed into an interactive one) or in sh, whatever the subject
another agent wrote. The red team's subject ``\\"; cmd #`` ran ``cmd`` in another session's pane when the subject
stood in double quotes with only ``"`` escaped (the attack from a real pane: tests/integration/test_agent_attacks.py).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from services.witness.effects.nudge import mail_announcement

SUBJECTS = (
    '\\"; touch {marker} #',  # the red team's
    "'; touch {marker}; '",
    "it's'; touch {marker} #",
    "$(touch {marker})",
    "`touch {marker}`",
    "!!; touch {marker}",
    "x) ; touch {marker} ; (",
    "\\'; touch {marker} #",
    "a\ntouch {marker}",
    "{{ touch {marker}; }}",
)


@pytest.mark.parametrize("template", SUBJECTS)
def test_a_hostile_subject_runs_nothing_in_a_shell(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    line = mail_announcement("polecat:demo/ace", template.format(marker=shlex.quote(str(marker))), "hq-m1")
    for shell in (["bash", "--norc", "-c", line], ["sh", "-c", line]):
        subprocess.run(shell, capture_output=True, cwd=tmp_path, timeout=30, check=False)
    # Typed, as the witness types it: an interactive bash reading it as a line of input.
    subprocess.run(
        ["bash", "--norc", "-i"],
        input=line + "\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert not marker.exists(), line


def test_the_old_double_quoting_ran_the_red_teams_subject(tmp_path: Path) -> None:
    """That the check above can see a line run: the announcement as it was, with the red team's subject."""
    marker = tmp_path / "ran"
    subject = f'\\"; touch {shlex.quote(str(marker))} #'.replace('"', '\\"')
    old = f'[gastown mail from polecat:demo/ace, written by an agent, not your operator] subject: "{subject}" (read it)'
    subprocess.run(["bash", "--norc", "-c", old], capture_output=True, cwd=tmp_path, timeout=30, check=False)
    assert marker.exists()
