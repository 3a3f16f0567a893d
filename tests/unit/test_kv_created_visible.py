"""A bucket just created is looked up again while a cluster does not find it yet (its stream's leader being
elected, the client reconnected to another node): a service stopped at start-up for it (the compose topology
test's mayor, once), where it only had to ask again."""

from __future__ import annotations

from typing import Any

import nats.js.errors
import pytest

from shared.bus import topology


class ClusterCatchingUp:
    """The two JetStream calls ``create_kv`` makes; the stream is found only after ``missing`` look-ups."""

    def __init__(self, missing: int) -> None:
        self.missing = missing
        self.added: list[str] = []
        self.lookups = 0

    async def add_stream(self, config: Any) -> None:
        self.added.append(config.name)

    async def key_value(self, bucket: str) -> str:
        self.lookups += 1
        if self.lookups <= self.missing:
            raise nats.js.errors.BucketNotFoundError
        return f"bucket {bucket}"


async def test_a_bucket_not_found_just_after_it_was_made_is_looked_up_again() -> None:
    js = ClusterCatchingUp(missing=3)
    made: Any = await topology.create_kv(js, "GT_SERVICES", ttl=60, replicas=3)  # type: ignore[arg-type]
    assert made == "bucket GT_SERVICES"
    assert (js.added, js.lookups) == (["KV_GT_SERVICES"], 4), "made once, looked up until found"


async def test_a_bucket_never_found_is_said_missing_after_the_attempts() -> None:
    js = ClusterCatchingUp(missing=topology.CREATED_VISIBLE_ATTEMPTS)
    with pytest.raises(nats.js.errors.BucketNotFoundError):
        await topology.create_kv(js, "GT_SERVICES", ttl=60, replicas=3)  # type: ignore[arg-type]
    assert js.lookups == topology.CREATED_VISIBLE_ATTEMPTS
