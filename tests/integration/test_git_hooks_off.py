"""A service's git never runs hooks or an fsmonitor a repository's config names, and whatever git does run (the
target repository's own server-side hooks on a push) sees an allowlisted environment, never the service's NATS
credentials or the town's secrets. Real git, the functions of ``shared.host.git`` the witness and the refinery use.

The attacks of the red-team report (turn 4): W1 (an agent sets ``core.hooksPath`` in the rig clone's config its
worktree shares: the witness's ``git worktree add`` and fetches ran the hook with the witness's secrets) and G4/L11
(a ``pre-receive`` hook planted in the rig repository ran inside the refinery's push with its NATS password).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from shared.host import git
from tests.integration.test_gate_user import gate_user  # noqa: F401 (fixture)

SECRETS = {
    "NATS_USER": "witness",
    "NATS_PASSWORD": "witness-password-1",
    "NATS_PASSWORD_FILE": "/run/secrets/witness.password",
    "NATS_CREDS": "/run/secrets/witness.creds",
    "GT_AUTH_ISSUER_SEED": "SAAISSUERSEEDSECRET2",
    "GT_SESSION_KEY": "session-key-secret-3",
    "GT_NATS_AUTH_PASSWORD": "auth-password-4",
    "GT_NATS_SYS_PASSWORD": "sys-password-5",
    "REFINERY_NATS_PASSWORD": "refinery-password-6",
    "ANTHROPIC_API_KEY": "anthropic-key-7",
}
HOOKS = ("post-checkout", "reference-transaction", "pre-push", "pre-commit", "post-commit", "post-merge")
DUMP_HOOK = '#!/bin/sh\nenv > "{dumps}/$(basename "$0").$$.env"\nexit 0\n'


@pytest.fixture(autouse=True)
def _secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a service started by docker-compose or `gt up`: its credentials are in its environment."""
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git.git("add", "--", name, cwd=repo)
    git.git("commit", "--quiet", "-m", f"add {name}", cwd=repo)
    return git.git("rev-parse", "HEAD", cwd=repo).strip()


def evil_hooks(root: Path, dumps: Path) -> Path:
    """A hooks directory whose every hook dumps its environment into ``dumps``."""
    hooks = root / "evilhooks"
    hooks.mkdir()
    for name in (*HOOKS, "pre-receive", "update", "post-receive", "push-to-checkout"):
        path = hooks / name
        path.write_text(DUMP_HOOK.format(dumps=dumps))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return hooks


def fsmonitor(root: Path, dumps: Path) -> Path:
    script = root / "fsmonitor.sh"
    script.write_text(f'#!/bin/sh\nenv > "{dumps}/fsmonitor.$$.env"\nexit 1\n')
    script.chmod(0o755)
    return script


def dumped(dumps: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(dumps.iterdir())}


def leaks(text: str) -> list[str]:
    return sorted(key for key, value in SECRETS.items() if key in text or value in text)


def test_hooks_and_an_fsmonitor_an_agent_put_in_the_shared_clone_config_never_run_in_the_witnesss_git(
    tmp_path: Path,
) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    origin = tmp_path / "origin"
    git.git("init", "--quiet", "-b", "main", str(origin))
    commit(origin, "README", "base\n")
    bare = tmp_path / "rigs" / "demo" / "repo.git"
    assert git.ensure_bare_clone(str(origin), bare)
    # W1: what an agent does from its workspace. The config is its own now (a repository of its own, not a worktree
    # of the clone): the clone's is untouched.
    first = tmp_path / "polecats" / "ace"
    git.ensure_worktree(bare, first, "polecat/ace/one", "main")
    hooks = evil_hooks(tmp_path, dumps)
    subprocess.run(["git", "config", "core.hooksPath", str(hooks)], cwd=first, check=True)
    subprocess.run(["git", "config", "core.fsmonitor", str(fsmonitor(tmp_path, dumps))], cwd=first, check=True)
    shared = subprocess.run(["git", "config", "--get", "core.hooksPath"], cwd=bare, capture_output=True, text=True)
    assert not shared.stdout.strip(), "no config is shared"
    # Even so, written into the clone's own config (an agent of the same OS user can), it runs in no service's git.
    subprocess.run(["git", "config", "core.hooksPath", str(hooks)], cwd=bare, check=True)
    subprocess.run(["git", "config", "core.fsmonitor", str(fsmonitor(tmp_path, dumps))], cwd=bare, check=True)

    # What the witness does next: fetch, add the next session's worktree, look at a worktree's state, push it,
    # remove it; every one of these runs hooks (reference-transaction, post-checkout, pre-push) or the fsmonitor.
    git.fetch(bare)
    second = tmp_path / "polecats" / "bee"
    git.ensure_worktree(bare, second, "polecat/bee/two", "main")
    (second / "work.txt").write_text("work\n")
    assert git.status_paths(second) == ["work.txt"]
    git.git("add", "work.txt", cwd=second)
    git.git("commit", "--quiet", "-m", "work", cwd=second)
    git.publish(second, "polecat/bee/two", "main", tmp_path / "published")
    assert git.worktree_state(second, "main").unpushed == 0
    git.remove_worktree(bare, second, "main")
    assert dumped(dumps) == {}, "a hook or the fsmonitor ran inside the service's git"

    # The control: the same config does run the hooks in a plain git (so the assertion above means something).
    plain = subprocess.run(
        ["git", "commit", "--quiet", "--allow-empty", "-m", "plain"],
        cwd=first,
        env={**os.environ, **git.GIT_ENV},
        capture_output=True,
        check=False,
    )
    assert plain.returncode == 0, plain.stderr
    ran = dumped(dumps)
    assert any(name.startswith("pre-commit.") for name in ran), sorted(ran)
    assert leaks("".join(ran.values())) != [], "the control git ran with the test's own (secret) environment"


def test_hooks_planted_in_a_local_target_never_run_in_the_refinerys_push(tmp_path: Path) -> None:
    """G4/L11: an agent that can write the rig's repository (the same OS user) plants server-side hooks there; the
    refinery's push into a repository on this machine runs none of them (they would run with its rights: root in
    the compose stack), and the checked-out main of a plain clone is still updated."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    target = tmp_path / "project"  # a plain checkout with main checked out, as on a laptop
    git.git("init", "--quiet", "-b", "main", str(target))
    commit(target, "README", "base\n")
    hooks = evil_hooks(tmp_path, dumps)
    for name in ("pre-receive", "update", "post-receive", "reference-transaction"):
        (target / ".git" / "hooks" / name).write_bytes((hooks / name).read_bytes())
        (target / ".git" / "hooks" / name).chmod(0o755)
    work = tmp_path / "refinery-work"
    git.git("clone", "--quiet", "--", str(target), str(work))
    merged = commit(work, "MERGED", "merged\n")

    receive_pack = git.checkout_receive_pack(str(target))
    assert receive_pack == git.UPDATE_INSTEAD_RECEIVE_PACK
    result = git.push_commit(work, merged, "main", receive_pack=receive_pack)
    assert result.exit_code == 0, result.stderr
    assert git.git("rev-parse", "HEAD", cwd=target).strip() == merged
    assert (target / "MERGED").read_text() == "merged\n", "updateInstead updated the clean checkout"
    assert dumped(dumps) == {}, "a hook planted in the target ran inside the refinery's push"

    # A bare repository on this machine: the same.
    bare = tmp_path / "origin.git"
    git.git("clone", "--quiet", "--bare", "--", str(target), str(bare))
    for name in ("pre-receive", "update", "post-receive"):
        (bare / "hooks" / name).write_bytes((hooks / name).read_bytes())
        (bare / "hooks" / name).chmod(0o755)
    assert git.checkout_receive_pack(str(bare)) == git.LOCAL_RECEIVE_PACK
    git.git("remote", "set-url", "origin", str(bare), cwd=work)
    again = commit(work, "AGAIN", "again\n")
    result = git.push_commit(work, again, "main", receive_pack=git.checkout_receive_pack(str(bare)))
    assert result.exit_code == 0, result.stderr
    assert dumped(dumps) == {}
    # A repository behind a URL runs its server's own hooks (its receive-pack is the server's).
    assert git.checkout_receive_pack("ssh://git@example.invalid/demo.git") is None


def test_a_hook_in_a_local_target_refuses_nothing_a_plain_push_would_not(tmp_path: Path) -> None:
    """The control: the same refusing hook does stop a plain push (so the refinery's push really skips it)."""
    target = tmp_path / "origin.git"
    git.git("init", "--quiet", "--bare", "-b", "main", str(target))
    seed = tmp_path / "seed"
    git.git("clone", "--quiet", "--", str(target), str(seed))
    commit(seed, "README", "base\n")
    git.git("push", "--quiet", "origin", "main", cwd=seed)
    hook = target / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'protected branch' >&2\nexit 1\n")
    hook.chmod(0o755)
    change = commit(seed, "CHANGE", "x\n")
    plain = git.push_commit(seed, change, "main")
    assert plain.exit_code != 0
    assert "protected branch" in plain.stderr
    refinerys = git.push_commit(seed, change, "main", receive_pack=git.checkout_receive_pack(str(target)))
    assert refinerys.exit_code == 0, refinerys.stderr


def test_the_refinery_as_root_runs_what_a_local_targets_config_names_only_as_its_owner(
    tmp_path: Path,
    gate_user: str,  # noqa: F811 (the fixture)
) -> None:
    """The compose stack's refinery is root and the rig's repository belongs to the agents' user, who can write its
    config. Hooks are off, but config can name other commands git runs (``core.alternateRefsCommand`` on a push's
    receiving side): they run as the repository's owner, never as root."""
    import pwd

    owner = pwd.getpwnam(gate_user)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dumps.chmod(0o777)
    target = tmp_path / "origin.git"
    seed = tmp_path / "seed"
    git.git("init", "--quiet", "--bare", "-b", "main", str(target))
    git.git("clone", "--quiet", "--", str(target), str(seed))
    commit(seed, "README", "base\n")
    git.git("push", "--quiet", "origin", "main", cwd=seed)
    other = tmp_path / "other.git"
    git.git("init", "--quiet", "--bare", str(other))
    (target / "objects" / "info" / "alternates").write_text(f"{other / 'objects'}\n")
    script = tmp_path / "whoami.sh"
    script.write_text(f'#!/bin/sh\nid -u > "{dumps}/alternate-refs.$$"\n')
    script.chmod(0o755)
    subprocess.run(["git", "config", "core.alternateRefsCommand", str(script)], cwd=target, check=True)
    for path in (tmp_path, *tmp_path.parents):
        if path == Path("/"):
            break
        path.chmod(path.stat().st_mode | 0o011)  # the owner may reach it (a test directory under root's)
    subprocess.run(["chown", "-R", f"{owner.pw_uid}:{owner.pw_gid}", str(target), str(other)], check=True)

    receive_pack = git.checkout_receive_pack(str(target))
    assert receive_pack is not None
    assert receive_pack.startswith(f"setpriv --reuid={owner.pw_uid} ")
    change = commit(seed, "CHANGE", "x\n")
    result = git.push_commit(seed, change, "main", receive_pack=receive_pack)
    assert result.exit_code == 0, result.stderr
    ran = [path.read_text().strip() for path in dumps.iterdir()]
    assert ran, "the repository's alternateRefsCommand ran (the control: config does name commands)"
    assert set(ran) == {str(owner.pw_uid)}, f"it ran as {ran}, not as the repository's owner"
