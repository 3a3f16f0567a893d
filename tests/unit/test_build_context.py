"""The image build context (``.dockerignore``): everything the Dockerfile copies, and no secret or local state.

A `docker-compose up --build` sends the context to the engine; without a ``.dockerignore`` that was every password
in ``.env``, the virtualenv and the git history (issue 29)."""

from __future__ import annotations

from tests.conftest import REPO_ROOT


def _included() -> set[str]:
    """The top-level names ``.dockerignore`` lets in: it ignores everything (``*``), then re-includes by name."""
    lines = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", "everything is left out unless named: a new file stays out of the build by default"
    return {rule[1:].rstrip("/") for rule in rules[1:] if rule.startswith("!")}


def test_everything_the_dockerfile_copies_is_in_the_context() -> None:
    copied = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            copied += [source.rstrip("/") for source in words[1:-1]]
    assert copied, "the Dockerfile copies the project"
    assert set(copied) <= _included(), set(copied) - _included()


def test_no_secret_or_local_state_is_in_the_context() -> None:
    included = _included()
    for name in (".env", ".git", ".venv", ".tools", "tests", "artifacts", "test-artifacts"):
        assert name not in included, name
