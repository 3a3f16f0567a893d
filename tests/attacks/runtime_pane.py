"""Run by a real agent runtime's own shell tool in a polecat's pane (Codex CLI, Gemini CLI, OpenCode), so with exactly
the environment that runtime gives its tool calls: what credentials that environment and the runtime's files hand
the agent. It writes what it found to a JSON report; the test (tests/integration/test_agent_attacks.py) judges it.

- ``credentials``: every variable of the tool call's environment whose name says it is a credential (the runtime's
  own model key among them, which the agent's runtime needs), and the session's NATS identity as it is given;
- ``written_secrets``: the files of the session's runtime dir (its config home: ``HOME``, ``CODEX_HOME``, the
  ``XDG_*`` dirs, ``OPENCODE_CONFIG``) and of its worktree that hold a secret the session knows (its NATS
  password, a model key from its environment or its runtime's process): a config that wrote a key into a file
  would hand it to anything that reads the file later, a commit included;
- ``secrets_on_command_lines``: the processes on this machine whose command line holds one of those secrets (a
  command line is readable by every user of the machine, every other session's agent included).

Standalone (the standard library only).

    python runtime_pane.py REPORT
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

CREDENTIAL_NAME = re.compile(
    r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|SEED|CREDS|CREDENTIAL|(?:^|_)AUTH(?:_|$)", re.IGNORECASE
)
NOT_CREDENTIALS = re.compile(r"GIT_CONFIG_KEY_\d+")
"""Names of git settings Gemini CLI gives its shell (``GIT_CONFIG_KEY_<n>``), not of secrets."""
MAX_FILE = 2_000_000


def is_credential(name: str) -> bool:
    return CREDENTIAL_NAME.search(name) is not None and NOT_CREDENTIALS.fullmatch(name) is None


def ancestors_environ() -> dict[str, str]:
    """The environment of this process's ancestors up to the pane (the runtime's among them): what the agent can
    read of its runtime's environment when the tool call's was cut down."""
    found: dict[str, str] = {}
    pid = os.getppid()
    for _ in range(8):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        for item in raw.split(b"\0"):
            name, _, value = item.decode(errors="replace").partition("=")
            if name and is_credential(name) and value:
                found.setdefault(name, value)
        parent = re.search(r"^PPid:\s+(\d+)", status, re.MULTILINE)
        if parent is None or parent.group(1) in ("0", "1"):
            break
        pid = int(parent.group(1))
    return found


def files_holding(roots: list[Path], secrets: dict[str, str]) -> list[str]:
    """``name: path`` for each file below ``roots`` (``.git`` left out) that holds a secret's value."""
    found: list[str] = []
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in (".git", "node_modules")]
            for name in names:
                path = Path(folder) / name
                try:
                    if path.is_symlink() or path.stat().st_size > MAX_FILE:
                        continue
                    text = path.read_bytes()
                except OSError:
                    continue
                found += [f"{what}: {path}" for what, value in secrets.items() if value.encode() in text]
    return found


def command_lines_holding(secrets: dict[str, str], town: list[str]) -> list[str]:
    """``name: pid command`` for each process of this town (its command line names one of ``town``: its GT_HOME, its
    tmux socket) whose command line holds a secret's value (other tests' towns may run with the same keys)."""
    found: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone in between
        if not any(mark.encode() in line for mark in town):
            continue
        for what, value in secrets.items():
            if value.encode() in line:
                program = line.split(b"\0")[0].decode(errors="replace")
                found.append(f"{what}: {entry.name} {program}")
    return found


def main(report_path: str) -> None:
    env = os.environ
    password_file = env.get("NATS_PASSWORD_FILE", "")
    secrets = {name: value for name, value in ancestors_environ().items() if len(value) >= 12}
    secrets.update({name: value for name, value in env.items() if is_credential(name) and len(value) >= 12})
    secrets.pop("NATS_PASSWORD_FILE", None)  # a path, not a secret
    secrets.pop("GT_LEASE_TOKEN", None)  # a fencing number, not a secret
    if password_file:
        secrets["NATS_PASSWORD"] = Path(password_file).read_text().strip()
    roots = [Path(env["GT_SESSION_DIR"]), Path(env["GT_WORKTREE"])]
    report = {
        "session": env.get("GT_SESSION"),
        "credentials": sorted(name for name in env if is_credential(name)),
        "nats_user": env.get("NATS_USER"),
        "nats_password_file": password_file,
        "runtime_credentials": sorted(ancestors_environ()),
        "written_secrets": files_holding(roots, secrets),
        "secrets_on_command_lines": command_lines_holding(secrets, [env["GT_HOME"], f"-L\0{env['GT_TMUX_SOCKET']}\0"]),
    }
    tmp = report_path + ".tmp"
    with open(tmp, "w") as file:
        json.dump(report, file, indent=1)
    os.replace(tmp, report_path)


if __name__ == "__main__":
    main(sys.argv[1])
