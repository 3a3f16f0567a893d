"""The version of a runtime's binary the witness writes into its first-run files: read from its npm package's
manifest when the binary is that package's (no process started), else asked with ``--version``."""

from __future__ import annotations

import json
from pathlib import Path

from services.witness.effects.runtime_setup import binary_version


def installed(root: Path, package: str, version: str, *, says: str) -> Path:
    """An npm install of ``package`` at ``version`` whose binary (linked from ``.bin``, as npm links it) says
    ``says`` to ``--version`` and leaves a mark when it runs."""
    folder = root / "node_modules" / package
    (folder / "bin").mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": package, "version": version}))
    binary = folder / "bin" / "tool.exe"
    binary.write_text(f"#!/bin/sh\ntouch {root / 'ran'}\necho '{says} (Tool)'\n")
    binary.chmod(0o755)
    link = root / "node_modules" / ".bin" / "tool"
    link.parent.mkdir()
    link.symlink_to(binary)
    return link


def test_the_version_of_a_packages_binary_is_read_from_its_manifest_without_starting_it(tmp_path: Path) -> None:
    binary = installed(tmp_path, "@vendor/tool", "1.18.33", says="0.0.1")
    assert binary_version(str(binary), "@vendor/tool") == "1.18.33"
    assert not (tmp_path / "ran").exists()


def test_a_binary_of_another_package_or_none_is_asked_its_version(tmp_path: Path) -> None:
    binary = installed(tmp_path, "someone-else", "1.0.0", says="2.1.332")
    assert binary_version(str(binary), "@vendor/tool") == "2.1.332"
    assert (tmp_path / "ran").exists()
