"""A scripted model server speaking the Anthropic Messages API, for tests, benchmarks and ``./dev demo``.

It lives in ``shared`` (not ``tests``) so that an installed checkout can run it: the demo starts it with
``python -m gt.model_server`` and the tests import it; it needs nothing beyond the standard library and the
project's own dependencies. See docs/agents.md, "The scripted model server".
"""

from gt.model_server.script import Fault, Script, ToolUse, Turn, bash, edit, exhaust_context, read, say, use, write
from gt.model_server.server import ModelServer, RecordedRequest, SentAnswer

__all__ = [
    "Fault",
    "ModelServer",
    "RecordedRequest",
    "Script",
    "SentAnswer",
    "ToolUse",
    "Turn",
    "bash",
    "edit",
    "exhaust_context",
    "read",
    "say",
    "use",
    "write",
]
