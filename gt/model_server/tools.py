"""A script's tool use in the tools the runtime at hand offers. Pure.

Scripts are written with Claude Code's tool names (``Bash``, ``Write``, ``Edit``, ``Read``: ``script.bash`` and
friends). Each runtime offers its own: Codex CLI ``exec_command`` {cmd}; Gemini CLI ``run_shell_command``
{command}, ``write_file`` {file_path, content}, ``replace`` {file_path, old_string, new_string}, ``read_file``;
OpenCode ``bash`` {command, description}, ``write`` {filePath, content}, ``edit`` {filePath, oldString,
newString}, ``read`` {filePath} (../shared/research/runtimes.md; the parameter names are read from the schema each
request sends, so a renamed one is still found). A use the runtime has no tool for is done with its shell tool:
the file's content travels base64-encoded (Gemini CLI refuses a command with ``$(...)`` or backticks). A script
may name a runtime's own tool: it is sent as written.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping
from typing import Any

from gt.model_server.asked import schema_instance

SHELL_TOOLS = ("Bash", "exec_command", "run_shell_command", "bash", "shell")
WRITE_TOOLS = ("Write", "write_file", "write")
EDIT_TOOLS = ("Edit", "replace", "edit")
READ_TOOLS = ("Read", "read_file", "read")
PATH_NAMES = ("file_path", "filePath", "absolute_path", "path")
SHELL_YIELD_MS = 30_000
"""Codex's ``exec_command`` returns after ``yield_time_ms`` (at most 30 s) with a process id to poll; a script's
commands are short, so it waits the longest it may."""
SHELL_TIMEOUT_MS = 600_000
"""OpenCode stops a command after 2 minutes unless its call says otherwise (``gt done`` may wait on the town)."""

_EDIT_PROGRAM = (
    "import base64,sys;p=sys.argv[1];o,n=(base64.b64decode(a).decode() for a in sys.argv[2:]);"
    "s=open(p).read();assert o in s,'old text not found in '+p;open(p,'w').write(s.replace(o,n,1));"
    "print('The file '+p+' has been updated.')"
)


def _properties(schema: Any) -> Mapping[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


def _path_key(schema: Any) -> str:
    properties = _properties(schema)
    return next((name for name in PATH_NAMES if name in properties), "file_path")


def _key(schema: Any, *names: str) -> str:
    properties = _properties(schema)
    return next((name for name in names if name in properties), names[0])


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _offered(offered: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in offered), None)


def shell_call(command: str, description: str, offered: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``command`` in the runtime's shell tool (``Bash`` when it offers none: a script failure shows it)."""
    name = _offered(offered, SHELL_TOOLS) or "Bash"
    schema = offered.get(name)
    properties = _properties(schema)
    if name == "exec_command":
        arguments: dict[str, Any] = {_key(schema, "cmd", "command"): command}
        if "yield_time_ms" in properties:
            arguments["yield_time_ms"] = SHELL_YIELD_MS
        return name, arguments
    if name == "shell":  # Codex's older array form
        return name, {"command": ["bash", "-c", command]}
    arguments = {"command": command}
    if "description" in properties or name == "bash":
        arguments["description"] = description or command[:60]
    if "timeout" in properties:
        arguments["timeout"] = SHELL_TIMEOUT_MS
    return name, arguments


def concrete(name: str, tool_input: Mapping[str, Any], offered: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The runtime's tool and arguments for a script's tool use ``name`` with ``tool_input`` (Claude Code's
    names and arguments), given the tools a request ``offered`` (name -> parameter schema). A parameter the tool
    requires that the use does not say (Gemini CLI's ``replace`` asks an ``instruction``) is filled in."""
    tool, arguments = _translated(name, tool_input, offered)
    schema = offered.get(tool)
    required = schema.get("required") if isinstance(schema, Mapping) else None
    for missing in [key for key in required or () if isinstance(key, str) and key not in arguments]:
        arguments[missing] = schema_instance(_properties(schema).get(missing) or {}, f"{name} as the script says")
    return tool, arguments


def _translated(name: str, tool_input: Mapping[str, Any], offered: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if name in offered or not offered:
        return name, dict(tool_input)
    if name == "Bash":
        return shell_call(str(tool_input["command"]), str(tool_input.get("description", "")), offered)
    path = str(tool_input.get("file_path", ""))
    if name == "Write":
        content = str(tool_input.get("content", ""))
        own = _offered(offered, WRITE_TOOLS)
        if own is not None:
            return own, {_path_key(offered[own]): path, _key(offered[own], "content"): content}
        # Its directory: "/" for a file at the root, "." for a relative path without one ("a.txt".rsplit is itself).
        directory = shlex.quote((path.rsplit("/", 1)[0] or "/") if "/" in path else ".")
        command = f"mkdir -p {directory} && printf %s {_b64(content)} | base64 -d > {shlex.quote(path)}"
        return shell_call(command + f" && echo 'File created successfully at: {path}'", f"write {path}", offered)
    if name == "Edit":
        old, new = str(tool_input.get("old_string", "")), str(tool_input.get("new_string", ""))
        own = _offered(offered, EDIT_TOOLS)
        if own is not None:
            schema = offered[own]
            return own, {
                _path_key(schema): path,
                _key(schema, "old_string", "oldString"): old,
                _key(schema, "new_string", "newString"): new,
            }
        command = " ".join(shlex.quote(part) for part in ("python3", "-c", _EDIT_PROGRAM, path, _b64(old), _b64(new)))
        return shell_call(command, f"edit {path}", offered)
    if name == "Read":
        own = _offered(offered, READ_TOOLS)
        if own is not None:
            return own, {_path_key(offered[own]): path}
        return shell_call(f"cat {shlex.quote(path)}", f"read {path}", offered)
    return name, dict(tool_input)
