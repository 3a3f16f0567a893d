"""Text someone else wrote, made safe to show on a terminal (or in an agent's prompt). Pure.

Agents are hostile: a mail subject, a bead's title or description, an escalation, a handoff note may carry
``\\x1b]0;pwned\\x07`` (a new window title), ``\\x1b[2J`` (a cleared screen), a carriage return (a line written
over), a bidi override (text that reads in another order than it is). None of it may reach a terminal as it
is: every ``gt`` text output shows such characters escaped (``\\x1b``, ``\\r``, ``\\u202e``), visibly, instead.

``escape_line`` is for a field shown on one line (a title, a subject, an actor, a cell of a table): a newline
and a tab are escaped too. ``escape_text`` is for a body shown as lines (a mail's body, a description): it keeps
the newline and the tab. Both escape every other C0 control, DEL, every C1 control (``\\x80``-``\\x9f``), the
bidi embeddings, overrides, isolates and marks, the Unicode line and paragraph separators, and lone surrogates
(which no terminal encoding can even write). A backslash is not escaped: escaping twice changes nothing
(``escape_line(escape_line(x)) == escape_line(x)``), the text is for reading, not for decoding back.
"""

from __future__ import annotations

import re

_ALWAYS = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1
    "\u061c\u200e\u200f"  # bidi marks: Arabic letter mark, left-to-right and right-to-left marks
    "\u202a-\u202e"  # bidi embeddings and overrides
    "\u2066-\u2069"  # bidi isolates
    "\u2028\u2029"  # line and paragraph separators (a line break to some readers)
    "\ud800-\udfff"  # lone surrogates
)
_IN_TEXT = re.compile(f"[{_ALWAYS}]")
_IN_LINE = re.compile(f"[\t\n{_ALWAYS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
CONTROL_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
"""A C0 control but the tab (a newline is one), DEL, or a C1 control: what may not be typed into a pane (a newline
presses Enter, ``\x03`` interrupts, ``\x1b`` starts an escape sequence) nor stay in a pane's stored text."""


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_line(value: object) -> str:
    """``value`` as one line of printable text: every control character (newline and tab included), bidi control
    and line separator escaped (``\\x1b``, ``\\n``, ``\\u202e``)."""
    text = value if isinstance(value, str) else str(value)
    return _IN_LINE.sub(_escaped, text)


def escape_text(value: object) -> str:
    """``value`` as lines of printable text: its newlines and tabs kept, every other control character, bidi
    control and line separator escaped."""
    text = value if isinstance(value, str) else str(value)
    return _IN_TEXT.sub(_escaped, text)


def json_safe(text: str) -> str:
    """JSON ``text`` with every character ``escape_text`` escapes written as a JSON escape (``\\u009b``), so it reads
    back as the same strings and shows nothing raw on a terminal. (An encoder escapes the C0 controls already; DEL,
    the C1 controls, bidi controls and line separators it writes as they are.)"""
    return _IN_TEXT.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def escaped_lines(value: object) -> list[str]:
    """``escape_text(value)`` cut at its newlines (not ``splitlines``: that also cuts at a carriage return, a form
    feed or a line separator, which would then not be shown)."""
    return escape_text(value).split("\n")


def is_safe(text: str, *, lines: bool = True) -> bool:
    """Whether ``text`` has nothing ``escape_text`` (``lines``) or ``escape_line`` would escape."""
    return (_IN_TEXT if lines else _IN_LINE).search(text) is None
