"""``./dev``'s own workings, run by bash as a user's shell runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.claude_code import REPO

PYENV_SHIM = """#!/bin/sh
# What pyenv's shim does for a version pyenv knows but has not selected: it is on PATH, it complains, exit 127.
echo "pyenv: $(basename "$0"): command not found" >&2
echo "The \\`$(basename "$0")' command exists in these Python versions:" >&2
exit 127
"""


def test_the_python_probe_runs_each_candidate_and_keeps_a_pyenv_shims_complaint_to_itself(tmp_path: Path) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3.12"
    shim.write_text(PYENV_SHIM)
    shim.chmod(0o755)
    (shims / "python3.11").symlink_to(sys.executable)  # an interpreter that runs
    probe = subprocess.run(
        ["bash", "-c", "source ./dev && pick_python"],
        cwd=REPO,
        env={"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "python3.11", "the shim that cannot run is passed over"
    assert probe.stderr == "", "nothing of the probe reaches the user's terminal"
