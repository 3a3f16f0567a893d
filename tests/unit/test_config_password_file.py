"""``NATS_PASSWORD_FILE``: a password read from a file (how a polecat session gets its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.core.config import load


def test_the_password_is_read_from_the_file_named(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    assert load({"NATS_USER": "agent", "NATS_PASSWORD_FILE": str(secret)}).nats_password == "s3cret"


def test_a_password_given_outright_wins(tmp_path: Path) -> None:
    env = {"NATS_PASSWORD": "outright", "NATS_PASSWORD_FILE": str(tmp_path / "missing")}
    assert load(env).nats_password == "outright"


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"NATS_PASSWORD_FILE .*missing"):
        load({"NATS_PASSWORD_FILE": str(tmp_path / "missing")})
