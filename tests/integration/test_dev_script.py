"""``./dev``'s own workings, run by bash as a user's shell runs them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.claude_code import REPO
from tests.helpers import wait_until

PYENV_SHIM = """#!/bin/sh
# What pyenv's shim does for a version pyenv knows but has not selected: it is on PATH, it complains, exit 127.
echo "pyenv: $(basename "$0"): command not found" >&2
echo "The \\`$(basename "$0")' command exists in these Python versions:" >&2
exit 127
"""


def test_the_python_probe_runs_each_candidate_and_keeps_a_pyenv_shims_complaint_to_itself(tmp_path: Path) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3.12"
    shim.write_text(PYENV_SHIM)
    shim.chmod(0o755)
    (shims / "python3.11").symlink_to(sys.executable)  # an interpreter that runs
    probe = subprocess.run(
        ["bash", "-c", "source ./dev && pick_python"],
        cwd=REPO,
        env={"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "python3.11", "the shim that cannot run is passed over"
    assert probe.stderr == "", "nothing of the probe reaches the user's terminal"


APT_RECORDER = """#!/bin/sh
# apt-get that installs nothing: it writes down what it was asked.
echo "$*" >> "$APT_LOG"
"""


def _command_path(tmp_path: Path) -> Path:
    """A PATH on which none of the tools ./dev may install is found: only what its functions run, and an apt-get
    that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("dirname", "id", "env", "mktemp", "grep", "sed", "cat", "rm", "sleep"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for fake, text in (("apt-get", APT_RECORDER), ("sudo", '#!/bin/sh\nexec "$@"\n')):
        (bin_dir / fake).write_text(text)
        (bin_dir / fake).chmod(0o755)
    return bin_dir


def _installs_of(command: str, tmp_path: Path) -> list[str]:
    """The packages ``./dev COMMAND`` asks apt-get to install on a machine that has none of them (its virtualenv,
    Claude Code and podman steps, which install nothing with apt-get here, left out)."""
    bin_dir = _command_path(tmp_path)
    log = tmp_path / f"apt-{command}.log"
    run = subprocess.run(
        [
            shutil.which("bash") or "bash",
            "-c",
            'source ./dev && setup_venv() { :; } && setup_agents() { :; } && setup_podman() { :; } && setup_for "$1"',
            "bash",
            command,
        ],
        cwd=REPO,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "APT_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "-qq update", calls
    (install,) = [call for call in calls if " install " in f" {call} "]
    return install.split()[install.split().index("-y") + 1 :]


def test_the_demo_installs_what_a_town_uses_and_not_what_only_the_tests_use(tmp_path: Path) -> None:
    demo = _installs_of("demo", tmp_path / "demo")
    assert demo == ["git", "tmux", "nodejs", "npm"], "git, tmux, and node with npm for Claude Code: no docker-compose"
    tests = _installs_of("test", tmp_path / "test")
    assert set(tests) == {"git", "tmux", "nodejs", "npm", "docker-compose", "chromium"}


def _private_apt_root(tmp_path: Path) -> Path:
    """An apt configuration of the test's own (APT_CONFIG): its package lists, dpkg status and caches in tmp_path
    and no sources, so the real apt-get takes the real locks and installs nothing."""
    root = tmp_path / "apt"
    for folder in ("lists/partial", "dpkg", "cache/archives/partial", "sources.list.d", "apt.conf.d", "prefs.d"):
        (root / folder).mkdir(parents=True)
    (root / "dpkg" / "status").touch()
    (root / "sources.list").touch()
    config = tmp_path / "apt.conf"
    config.write_text(
        f'Dir::State::Lists "{root}/lists";\n'
        f'Dir::State::status "{root}/dpkg/status";\n'
        f'Dir::Cache "{root}/cache";\n'
        f'Dir::Etc::SourceList "{root}/sources.list";\n'
        f'Dir::Etc::SourceParts "{root}/sources.list.d";\n'
        f'Dir::Etc::Parts "{root}/apt.conf.d";\n'
        f'Dir::Etc::PreferencesParts "{root}/prefs.d";\n'
    )
    return config


def _apt_get_through_dev(args: str, config: Path, tmp_path: Path, *, wait_s: int) -> subprocess.Popen[str]:
    # need_root runs it directly: the apt root is the test's own, whatever user runs the test.
    with (tmp_path / "stderr").open("w") as stderr:
        return subprocess.Popen(
            ["bash", "-c", f'source ./dev && need_root() {{ "$@"; }} && apt_get {args}'],
            cwd=REPO,
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(tmp_path),
                "APT_CONFIG": str(config),
                "GT_APT_WAIT": str(wait_s),
                "DEV_COMMAND": "demo",
            },
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )


@contextlib.contextmanager
def _held(lock_file: Path) -> Iterator[None]:
    """The lock apt and dpkg take (fcntl), held by this process as another apt-get would hold it."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("args", "lock"),
    [("update", "lists/lock"), ("install -y", "dpkg/lock-frontend")],
    ids=["the package lists' lock", "dpkg's lock"],
)
def test_a_held_apt_lock_is_waited_for_saying_which_and_then_apt_goes_on(args: str, lock: str, tmp_path: Path) -> None:
    config = _private_apt_root(tmp_path)
    lock_file = tmp_path / "apt" / lock
    with _held(lock_file):
        apt = _apt_get_through_dev(args, config, tmp_path, wait_s=120)
        try:
            note = wait_until(
                lambda: next(
                    (line for line in (tmp_path / "stderr").read_text().splitlines() if "waiting" in line), ""
                ),
                message="./dev says what it waits for",
            )
            assert note.startswith(f"dev: waiting for apt-get {args.split()[0]}: Could not get lock {lock_file}.")
            assert f"held by process {os.getpid()} " in note, "and which process holds it"
            assert apt.poll() is None, "it waits rather than failing"
        except BaseException:
            apt.kill()
            raise
    assert apt.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()


def test_a_lock_held_past_the_wait_gets_a_hint_naming_the_holder(tmp_path: Path) -> None:
    config = _private_apt_root(tmp_path)
    with _held(tmp_path / "apt" / "lists" / "lock"):
        apt = _apt_get_through_dev("update", config, tmp_path, wait_s=1)
        code = apt.wait(timeout=60)
    said = (tmp_path / "stderr").read_text()
    assert code != 0, said
    assert "dev: apt is still busy after 1 s (Could not get lock" in said
    assert f"ps -fp {os.getpid()}" in said
    assert "and run ./dev demo again, or wait longer: GT_APT_WAIT=SECONDS ./dev demo" in said
