"""What decoding bytes someone else wrote may raise, besides a plain syntax or schema error.

msgspec checks UTF-8 only when it builds a string (``UnicodeDecodeError`` up to 0.22, a ``DecodeError`` since
0.23), stops nesting at Python's recursion limit (``RecursionError``), and a conversion of a value may raise
``ValueError``. Every reader of commands, events, KV values or plugin marks catches all of these: a value nobody
can read is answered or skipped, never fatal to the loop that met it.
"""

from __future__ import annotations

import msgspec

UNDECODABLE: tuple[type[Exception], ...] = (msgspec.DecodeError, ValueError, RecursionError)
