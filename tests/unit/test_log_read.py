"""The batched direct get's answer, read as ``shared.bus.log_read`` reads it: each message names the one sent before
it, so a message lost on the way (a slow client's are dropped) cuts the batch there instead of leaving a hole."""

from __future__ import annotations

from typing import Any, cast

from nats.aio.msg import Msg

from shared.bus.log_read import Batch, _contiguous
from shared.bus.streams import Stored


def event(seq: int, before: int, pending: int) -> Msg:
    headers = {
        "Nats-Stream": "GT_EVT",
        "Nats-Subject": f"gt.evt.bead.hq-{seq}",
        "Nats-Sequence": str(seq),
        "Nats-Num-Pending": str(pending),
        "Nats-Last-Sequence": str(before),
    }
    return Msg(_client=cast(Any, None), subject="_INBOX_plugin.x", data=f"e{seq}".encode(), headers=headers)


def eob(last: int, pending: int) -> Msg:
    headers = {"Status": "204", "Description": "EOB", "Nats-Num-Pending": str(pending), "Nats-Last-Sequence": str(last)}
    return Msg(_client=cast(Any, None), subject="_INBOX_plugin.x", headers=headers)


def stored(*seqs: int) -> list[Stored]:
    return [Stored(seq, f"gt.evt.bead.hq-{seq}", f"e{seq}".encode()) for seq in seqs]


def test_a_complete_batch_is_kept_whole_with_what_is_pending_after_it() -> None:
    answer = [event(4, 0, 6), event(5, 4, 5), event(7, 5, 4), eob(7, 4)]  # 6 is not on the filter: not sent
    assert _contiguous("GT_EVT", answer) == Batch(stored(4, 5, 7), 4)


def test_a_lost_message_cuts_the_batch_before_the_hole() -> None:
    answer = [event(4, 0, 3), event(6, 5, 1), event(7, 6, 0), eob(7, 0)]  # 5 was dropped on the way
    batch = _contiguous("GT_EVT", answer)
    assert batch.messages == stored(4)
    assert batch.pending > 0, "the rest is read again at once"


def test_a_lost_first_message_or_tail_leaves_what_came_before_it() -> None:
    first_lost = _contiguous("GT_EVT", [event(5, 4, 1), event(6, 5, 0), eob(6, 0)])
    assert first_lost.messages == []
    assert first_lost.pending > 0
    tail_lost = _contiguous("GT_EVT", [event(4, 0, 2), event(5, 4, 1), eob(6, 0)])  # 6 was sent, never came
    assert tail_lost.messages == stored(4, 5)
    assert tail_lost.pending > 0
    end_lost = _contiguous("GT_EVT", [event(4, 0, 2), event(5, 4, 1)])  # the answer stopped coming (a timeout)
    assert end_lost == Batch(stored(4, 5), 1)


def test_nothing_there_is_an_empty_batch() -> None:
    assert _contiguous("GT_EVT", []) == Batch([], 0)
