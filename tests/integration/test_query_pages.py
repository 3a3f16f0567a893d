"""Lists far over the NATS server's message limit (4 MB): every list a user asks for arrives, page after page, and
none goes silent (a reply over the limit used to be dropped, and the user waited out the query timeout).

10,000 beads with 2.5 kB descriptions make a 27 MB list, as 100,000 beads of 270 bytes would; the CPU it costs to
fold 100,000 events is bench (r)'s (``python -m bench``), not the suite's."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client

from bench.common import bead_history, bulk_load
from shared.bus.query import ask_all, ask_json
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.model.queries import mayor
from tests.integration.test_cli import Gt
from tests.integration.test_cli import gt as gt
from tests.integration.test_mayor_service import run_mayor

BEADS = 10_000
DESCRIPTION_BYTES = 2_500


async def test_lists_far_over_the_message_limit_arrive_in_pages_through_the_api_and_the_cli(
    nc: Client, town: TownConfig, gt: Gt
) -> None:
    await provision(nc, town)
    stored = await bulk_load(nc, bead_history(BEADS, 0, close=False, description_bytes=DESCRIPTION_BYTES))
    assert stored == BEADS
    expected = [f"hq-{b:06d}" for b in range(BEADS)]
    async with run_mayor(town, rigs=()) as service:
        assert service.reader is not None
        await service.reader.wait_for_seq(stored, timeout=120)
        # Everything asked for at once: a page cut to what one reply carries, with its cursor; an answer, at once.
        first = await ask_json(nc, mayor.Beads(limit=0))
        assert 0 < len(first) < BEADS // 5, "the whole list is over five replies long"
        assert len(msgspec.json.encode(first)) < nc.max_payload
        listing = await ask_all(nc, mayor.Ready(limit=0))
        assert [b["id"] for b in listing.items] == expected
        assert not listing.more
        # The CLI pages by itself.
        listed = await gt("bead", "list", "--limit", "0", "--json", timeout=300)
        assert listed.code == 0, listed.err
        assert [b["id"] for b in listed.json()] == expected
        # The default limit shows the first thousand and says there are more.
        ready = await gt("ready", "--json", timeout=120)
        assert ready.code == 0, ready.err
        assert [b["id"] for b in ready.json()] == expected[:1000]
        assert "the first 1000 shown; more are listed" in ready.err
        # A page of a given size.
        middle = await gt("bead", "list", "--limit", "5", "--json", timeout=120)
        assert [b["id"] for b in middle.json()] == expected[:5]


async def test_a_limit_that_is_no_count_is_a_usage_error_before_anything_is_asked(gt: Gt) -> None:
    for command in (("ready",), ("bead", "list"), ("convoy", "list"), ("mail", "inbox"), ("escalations",)):
        negative = await gt(*command, "--limit", "-1")
        assert negative.code == 2, negative
        assert "must be 0 or more, got -1" in negative.err
        word = await gt(*command, "--limit", "many")
        assert word.code == 2, word
        assert "'many' is not a whole number" in word.err
