"""The benchmark suite still runs end to end (small sizes; its figures are not checked, only produced)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


# The whole benchmark suite, small: its own limit (900 s, below) rather than a single test's 300 s; on two busy
# cores it runs past 300 s since every pane and gate starts under a reaper. A soak run (`./dev soak`), not CI's:
# it was CI's longest test (9 minutes of a worker on two busy cores).
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_the_benchmarks_run_and_report_every_figure_with_its_ceiling(gt_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        env=gt_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-12000:]
    report = out.read_text()
    rows = [line for line in report.splitlines() if line.startswith("| (")]
    assert [row.split("|")[1].strip()[:3] for row in rows] == [
        "(a)",
        *["(b)"] * 4,  # one per service
        "(c)",
        "(d)",
        "(d)",
        "(e)",
        "(f)",
        "(g)",
        "(h)",
        "(h)",
        "(i)",
        "(j)",
        "(k)",
        *["(l)"] * 5,
        "(m)",
        "(m)",
        "(n)",
        "(n)",
        "(o)",
        *["(p)"] * 12,  # six calls, two modes
        *["(q)"] * 4,
        *["(r)"] * 3,
        *["(s)"] * 8,  # four runtimes, p50 and p99
        "(t)",
        *["(u)"] * 4,  # merge overhead and session start, p50 and max
        *["(v)"] * 3,  # serial, runners with a batch of R, and of N
        *["(w)"] * 2,  # warm against cold, and against pristine
    ]
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        assert cells[2] != "-", row  # a ceiling from the same run
        assert cells[3] != "-", row  # and a ratio against it
        assert float(cells[3]) > 0, row
    assert "nats-server" in report
