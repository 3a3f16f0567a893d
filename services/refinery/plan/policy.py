"""The merge queue's policy: how long a claim lasts, how often a merge request may fail, conflict or be retried,
batches and backoffs (built from the refinery's settings, ``GT_MQ_*``)."""

from __future__ import annotations

import msgspec

from services.refinery.settings import RefinerySettings


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    lease_s: float = 900.0
    max_failures: int = 3
    max_conflict_returns: int = 2
    fifo: bool = False
    batch: int = 1
    """Merge requests stacked and gated together (1: serial)."""
    batch_wait_s: float = 0.0
    push_retries: int = 8
    """Requeues in a row after a push that did not land (or a processing error) before failing and escalating."""
    push_backoff_s: float = 1.0
    push_backoff_max_s: float = 60.0
    target_failures_to_pause: int = 2
    """Gate failures on the target's tip in a row that pause the rig's queue (the first one requeues)."""


def policy_of(mq: RefinerySettings) -> Policy:
    """The policy the refinery's settings (``GT_MQ_*``) make."""
    return Policy(
        lease_s=mq.lease_s,
        max_failures=mq.max_failures,
        max_conflict_returns=mq.max_conflict_returns,
        fifo=mq.fifo,
        batch=mq.batch,
        batch_wait_s=mq.batch_wait_s,
        push_retries=mq.push_retries,
        push_backoff_s=mq.push_backoff_s,
        push_backoff_max_s=mq.push_backoff_max_s,
    )


# RETRY
