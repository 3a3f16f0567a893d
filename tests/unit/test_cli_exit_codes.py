"""What `gt` says and exits with when an error ends a call (gt/cli/main.py, one ``except``): the error's own
``exit_code`` and ``hint`` (shared/core/errors.py), word for word as before the ladder became one branch. The
integration tests reach some of these through a real town (tests/integration/test_cli.py: 2, 3 unreachable, 3 not
provisioned, 1 refused; test_permissions.py: 4); here every path, each error raised where the command would have run."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from gt.cli import main as cli_main
from gt.cli import patience
from gt.cli.common import EXIT_DENIED, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE, UsageError
from gt.cli.done_steps import DoneError
from services.deacon.automations.cron import CronError
from services.witness.effects.runtime_setup import RuntimeUnavailableError
from shared.bus.auth_callout import BadRequestError
from shared.core.config import TownConfig
from shared.core.errors import (
    STORAGE_FULL_HINT,
    AppendFailedError,
    AppendTimeoutError,
    BusTimeoutError,
    CommandError,
    EventLogLostError,
    GastownError,
    JetStreamApiError,
    JetStreamUnavailableError,
    NatsNotAnsweringError,
    NatsUnavailableError,
    NoStreamError,
    NotProvisionedError,
    PermissionDeniedError,
    QueryError,
    StreamConfigMismatchError,
)

UNREACHABLE = NatsUnavailableError("nats://127.0.0.1:1", "no server answered")


@pytest.fixture
def gt_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[BaseException]]:
    """``gt bead list`` with its dispatch raising what the test puts in the list."""
    monkeypatch.setenv("GT_HOME", str(tmp_path))
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    raising: list[BaseException] = []

    def dispatch(args: argparse.Namespace, config: TownConfig, *, embedded: bool, kept: object) -> int:
        raise raising[0]

    monkeypatch.setattr(cli_main, "_dispatch", dispatch)
    return (raising,)


def run(
    gt_call: tuple[list[BaseException]], error: BaseException, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    gt_call[0][:] = [error]
    code = cli_main.main(["bead", "list"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "code", "said"),
    [
        (UsageError("give a title"), EXIT_USAGE, "gt: give a title"),
        (UNREACHABLE, EXIT_UNREACHABLE, "gt: NATS is unreachable at nats://127.0.0.1:1: no server answered"),
        (
            CommandError("too_large", "the title is over 200 characters"),
            EXIT_REJECTED,
            "gt: refused (too_large): the title is over 200 characters; nothing was sent",
        ),
        (
            PermissionDeniedError("gt.cmd.bead.create", "reader"),
            EXIT_DENIED,
            "gt: permission denied: NATS user reader may not publish to gt.cmd.bead.create: the NATS server refused "
            "it and nothing was sent. Use the credentials of a user allowed to (NATS_USER, NATS_PASSWORD or "
            "NATS_CREDS; see docs/deployment.md)",
        ),
        (
            QueryError("unavailable", "the mayor is not running"),
            EXIT_UNREACHABLE,
            "gt: unavailable: the mayor is not running",
        ),
        (QueryError("timeout", "the mayor did not answer"), EXIT_UNREACHABLE, "gt: timeout: the mayor did not answer"),
        (QueryError("not_found", "no bead hq-x"), EXIT_REJECTED, "gt: not_found: no bead hq-x"),
        (
            AppendFailedError("gt.cmd.bead.create", 400, 10054, "message size exceeds maximum allowed"),
            EXIT_REJECTED,
            "gt: append to gt.cmd.bead.create refused: message size exceeds maximum allowed (code 400, err_code 10054)",
        ),
        (
            AppendFailedError("gt.cmd.bead.create", 400, 10002, "resource limits exceeded for account"),
            EXIT_REJECTED,
            "gt: append to gt.cmd.bead.create refused: resource limits exceeded for account (code 400, err_code "
            f"10002): {STORAGE_FULL_HINT}",
        ),
        (
            StreamConfigMismatchError("GT_EVT", {"retention": ("interest", "limits")}),
            EXIT_REJECTED,
            "gt: stream GT_EVT exists with an incompatible configuration (retention: have 'interest', need "
            "'limits'); fix or recreate it by hand, gastown-nats will not change it",
        ),
        (
            NatsNotAnsweringError("NoRespondersError"),
            EXIT_UNREACHABLE,
            "gt: NATS did not answer (NoRespondersError); is JetStream enabled and the town up?",
        ),
        (
            BusTimeoutError("TimeoutError"),
            EXIT_UNREACHABLE,
            "gt: NATS did not answer (TimeoutError); is JetStream enabled and the town up?",
        ),
        (
            JetStreamUnavailableError("ServiceUnavailableError"),
            EXIT_UNREACHABLE,
            "gt: NATS did not answer (ServiceUnavailableError); is JetStream enabled and the town up?",
        ),
        (
            NoStreamError(),
            EXIT_UNREACHABLE,
            "gt: no stream takes commands yet (nothing was stored); run `gt init` or `gt up`, then retry",
        ),
        (
            NotProvisionedError("stream not found"),
            EXIT_UNREACHABLE,
            "gt: not found: stream not found; run `gt init` (or `gt up`) first",
        ),
    ],
)
def test_an_error_says_itself_and_exits_with_its_code(
    gt_call: tuple[list[BaseException]], capsys: pytest.CaptureFixture[str], error: GastownError, code: int, said: str
) -> None:
    assert error.exit_code == code
    assert run(gt_call, error, capsys) == (code, said + "\n")


def test_an_unreadable_answer_is_refused(
    gt_call: tuple[list[BaseException]], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        msgspec.json.decode(b"{")
    except msgspec.DecodeError as exc:
        error = exc
    code, err = run(gt_call, error, capsys)
    assert (code, err.startswith("gt: unreadable answer: ")) == (EXIT_REJECTED, True)


def test_unreachable_nats_adds_what_gt_waited_and_knows_of_the_town(
    gt_call: tuple[list[BaseException]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Spent:
        def gave_up(self) -> str:
            return "waited 30 s for the town (GT_TOWN_PATIENCE)"

    monkeypatch.setattr(patience, "current", Spent)
    code, err = run(gt_call, UNREACHABLE, capsys)
    assert code == EXIT_UNREACHABLE
    assert err.splitlines() == [
        "gt: NATS is unreachable at nats://127.0.0.1:1: no server answered",
        "gt: waited 30 s for the town (GT_TOWN_PATIENCE)",
    ]


@pytest.mark.parametrize(
    "error",
    [
        AppendTimeoutError("gt.cmd.bead.create", 3),
        EventLogLostError("GT_EVT", "gone"),
        JetStreamApiError("bad request", code=400, err_code=10003),
        RuntimeError("a bug"),
    ],
)
def test_an_error_gt_does_not_expect_keeps_its_traceback(
    gt_call: tuple[list[BaseException]], error: BaseException
) -> None:
    gt_call[0][:] = [error]
    with pytest.raises(type(error)):
        cli_main.main(["bead", "list"])


def test_the_errors_outside_the_root_joined_it() -> None:
    for error in (DoneError("x"), RuntimeUnavailableError("x"), CronError("x"), BadRequestError("x")):
        assert isinstance(error, GastownError)
        assert not error.retryable, type(error)
    assert isinstance(CronError("x"), ValueError), "caught as before"
    assert isinstance(BadRequestError("x"), ValueError), "caught as before"
    assert DoneError("x").exit_code == EXIT_REJECTED
