"""Progress bars: the line they draw, and where and when they draw it."""

from __future__ import annotations

import io

from gt.cli.progress import Progress, bar_line, wanted


def test_a_bar_shows_done_total_and_percent() -> None:
    assert bar_line("x", 0, 4, width=4) == "x [....] 0/4   0%"
    assert bar_line("x", 3, 4, width=4) == "x [###.] 3/4  75%"
    assert bar_line("x", 9, 4, width=4) == "x [####] 4/4 100%"
    assert bar_line("x", 0, 0, width=4) == "x [####] 0/0 100%"


def test_piped_output_gets_no_bar_unless_asked_and_a_bar_never_hides_the_end() -> None:
    out = io.StringIO()
    assert not wanted(out, {})
    assert wanted(out, {"GT_PROGRESS": "always"})
    quiet = Progress("cooking", 3, out)
    quiet.advance()
    quiet.finish()
    assert out.getvalue() == ""

    shown = Progress("cooking", 3, out, enabled=True)
    for _ in range(3):
        shown.advance()
    shown.finish()
    shown.finish()  # once only
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("cooking [")
    assert lines[-1].endswith("3/3 100%")
    assert lines.count(lines[-1]) == 1
