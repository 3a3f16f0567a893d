"""The agent runtimes the conformance suite runs, each with its real binary (installed by ``./dev setup``, pinned in
``ops/<name>.version``) and the witness environment an operator would give it to reach a model server: the
vendor's conventional variables, nothing else.

A runtime is added to the suite by a row here (``RUNTIMES``) and its ``Runtime`` subclass in
``shared.model.runtimes``."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".tools" / "npm" / "node_modules"


@dataclass(frozen=True)
class AgentCli:
    """A runtime under test: its name (``gt rig add --agent``), npm package and pinned version file, the setting
    naming its binary, and the witness's variables pointing it at the model server."""

    name: str
    package: str
    version_file: str
    binary_setting: str
    key_variable: str
    key: str
    base_url_variable: str
    base_url_path: str = ""
    """Appended to the model server's address (OpenAI's clients expect ``/v1`` in the base URL)."""
    own_credentials: tuple[str, ...] = ()
    """Credentials the runtime itself gives its tool calls (beside its model key): its own, for its own process."""

    def pinned(self) -> str:
        return (REPO / "ops" / self.version_file).read_text().strip()

    def binary(self) -> Path:
        """The pinned binary; fails (never skips) when it is missing or another version: ``./dev setup``."""
        manifest = BIN / self.package / "package.json"
        path = BIN / ".bin" / self.name
        if not manifest.is_file() or not path.exists():
            raise AssertionError(f"{self.package} is not installed: run ./dev setup (it installs the pinned CLIs)")
        installed = json.loads(manifest.read_text())["version"]
        if installed != self.pinned():
            raise AssertionError(f"{self.package} is {installed}, not the pinned {self.pinned()}: run ./dev setup")
        return path

    def witness_env(self, base_url: str) -> dict[str, str]:
        """What the witness's environment holds for this runtime against the model server at ``base_url``."""
        return {self.binary_setting: str(self.binary()), **self.model_env(base_url)}

    def model_env(self, base_url: str) -> dict[str, str]:
        """The vendor's variables pointing the runtime at the model server at ``base_url`` (its key and endpoint): what
        an operator sets for a witness whose runtime is on its ``PATH`` (the compose stack's image)."""
        return {self.key_variable: self.key, self.base_url_variable: base_url + self.base_url_path}

    @property
    def build_variable(self) -> str:
        """The compose stack's setting that builds this runtime into the image at a version (docker-compose.yml's
        build arguments): ``GT_CODEX_VERSION`` for ``ops/codex.version``."""
        return "GT_" + self.version_file.removesuffix(".version").upper().replace("-", "_") + "_VERSION"

    def version(self) -> str:
        out = subprocess.run([str(self.binary()), "--version"], capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()


CLAUDE = AgentCli(
    name="claude",
    package="@anthropic-ai/claude-code",
    version_file="claude-code.version",
    binary_setting="GT_CLAUDE_BIN",
    key_variable="ANTHROPIC_API_KEY",
    key="sk-ant-api03-scripted-model-server-test-key-0123456789abcdefghij",
    base_url_variable="ANTHROPIC_BASE_URL",
    # Claude Code 2.1.332 serves a messaging socket of its own to its tool calls (CLAUDE_CODE_MESSAGING_SOCKET), and
    # hands them its token.
    own_credentials=("CLAUDE_CODE_MESSAGING_TOKEN",),
)
CODEX = AgentCli(
    name="codex",
    package="@openai/codex",
    version_file="codex.version",
    binary_setting="GT_CODEX_BIN",
    key_variable="OPENAI_API_KEY",
    key="sk-scripted-model-server-test-key",
    base_url_variable="OPENAI_BASE_URL",
    base_url_path="/v1",
)
GEMINI = AgentCli(
    name="gemini",
    package="@google/gemini-cli",
    version_file="gemini-cli.version",
    binary_setting="GT_GEMINI_BIN",
    key_variable="GEMINI_API_KEY",
    key="scripted-model-server-test-key",
    base_url_variable="GOOGLE_GEMINI_BASE_URL",
)
OPENCODE = AgentCli(
    name="opencode",
    package="opencode-ai",
    version_file="opencode.version",
    binary_setting="GT_OPENCODE_BIN",
    key_variable="OPENAI_API_KEY",
    key="sk-scripted-model-server-test-key",
    base_url_variable="OPENAI_BASE_URL",
    base_url_path="/v1",
)
RUNTIMES = (CLAUDE, CODEX, GEMINI, OPENCODE)
