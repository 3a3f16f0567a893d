"""How the refinery processes its queue: read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from shared.core.config import env_number


class RefinerySettings(msgspec.Struct, frozen=True, kw_only=True):
    lease_s: float = 900.0
    """A claim older than this is taken again (``GT_MQ_LEASE``): longer than the gates take."""
    merge_lease_ttl_s: float = 60.0
    """TTL of a rig's merge lease, renewed every third of it while a batch is processed
    (``GT_MQ_MERGE_LEASE_TTL``; never longer than ``lease_s``): a refinery that stops renewing is fenced out and
    another takes the rig over."""
    gate_timeout_s: float = 600.0
    """Each gate command's time limit (``GT_MQ_GATE_TIMEOUT``)."""
    max_failures: int = 3
    """Failed gate runs of one bead before it is escalated instead of sent back (``GT_MQ_MAX_FAILURES``)."""
    max_conflict_returns: int = 2
    """Merge conflicts of one bead sent back to its agent to resolve; the next one is the operator's, as a
    conflict bead (``GT_MQ_MAX_CONFLICT_RETURNS``; 0: every conflict is the operator's)."""
    fifo: bool = False
    """``GT_MQ_ORDER=fifo``: oldest first instead of by score."""
    batch: int = 1
    """``GT_MQ_BATCH``: merge requests of a rig stacked and gated together, bisected when red (1: serial)."""
    batch_wait_s: float = 0.0
    """``GT_MQ_BATCH_WAIT``: seconds a rig with fewer than ``batch`` ready merge requests waits for more."""
    push_retries: int = 8
    """``GT_MQ_PUSH_RETRIES``: times one merge request goes back into the queue in a row because its push did not
    land (the target moved, the repository could not be reached) or its processing failed, before it is failed
    and escalated instead."""
    push_backoff_s: float = 1.0
    """``GT_MQ_PUSH_BACKOFF``: the wait before the first such retry; it doubles with each one after."""
    push_backoff_max_s: float = 60.0
    """``GT_MQ_PUSH_BACKOFF_MAX``: the longest wait between two such retries."""
    max_bytes: int = 50 * 1000 * 1000
    """``GT_MR_MAX_BYTES``: the most a polecat's published branch may add (its bundle's size, the new objects
    compressed); a larger one is refused ``too_large`` when it is submitted."""
    runners: int = 0
    """``GT_MQ_RUNNERS``: gates run as jobs on this many gate runners (``gt-runner``), that many candidates at once
    (speculation: the cuts of a batch, each on its own runner); 0: the refinery runs the gates itself, one at a
    time. ``GT_MQ_BATCH`` is ``BATCH_PER_RUNNER`` times this many unless set."""
    retry_red: bool = False
    """``GT_MQ_RETRY_RED=1``: a candidate whose gate fails is gated once more before its merge request is blamed;
    passing then, it is recorded flaky (``mr.merged``'s ``flaky``) and not blamed."""
    runner_wait_s: float = 600.0
    """``GT_MQ_RUNNER_WAIT``: how long a gate job may wait for a runner to take it (beyond the gates' own time
    limits) before the batch goes back into the queue."""
    runner_stale_s: float = 3.0
    """``GT_SERVICE_STALE_AFTER`` (the deacon's): a runner whose newest service heartbeat is older than this shows
    as down on the board (``gt mq runners``)."""
    gate_user: str = ""
    """``GT_GATE_USER``: the OS user the gates run as, in a copy of the worktree (the refinery must run as root;
    see ``shared.host.gates.user``). Empty: the refinery's own user, in its worktree."""


BATCH_PER_RUNNER = 4
"""With runners, a batch is this many merge requests per runner unless ``GT_MQ_BATCH`` says: R runners gate R cuts of
it at once, so a green queue of 4R lands in one round and a culprit is found in log_(R+1) of the batch (measured:
16 merge requests on 4 runners against serial mode, 0.41 with batches of 4, 0.27-0.29 with 16)."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value not in ("", "0", "1", "yes", "no", "true", "false"):
        raise ValueError(f"{name} must be 1 or 0, got {value!r}")
    return value in ("1", "yes", "true")


def load(env: Mapping[str, str] | None = None) -> RefinerySettings:
    """Raises ValueError naming a setting whose value cannot be used."""
    env = os.environ if env is None else env
    order = env.get("GT_MQ_ORDER", "score") or "score"
    if order not in ("score", "fifo"):
        raise ValueError(f"GT_MQ_ORDER must be score or fifo, got {order!r}")
    runners = int(env_number(env, "GT_MQ_RUNNERS", 0, minimum=0, whole=True))
    return RefinerySettings(
        lease_s=env_number(env, "GT_MQ_LEASE", 900.0, minimum=1.0),
        merge_lease_ttl_s=env_number(env, "GT_MQ_MERGE_LEASE_TTL", 60.0, minimum=0.3),
        gate_timeout_s=env_number(env, "GT_MQ_GATE_TIMEOUT", 600.0, minimum=1.0),
        max_failures=int(env_number(env, "GT_MQ_MAX_FAILURES", 3, minimum=1, whole=True)),
        max_conflict_returns=int(env_number(env, "GT_MQ_MAX_CONFLICT_RETURNS", 2, minimum=0, whole=True)),
        fifo=order == "fifo",
        runners=runners,
        retry_red=_flag(env, "GT_MQ_RETRY_RED"),
        runner_wait_s=env_number(env, "GT_MQ_RUNNER_WAIT", 600.0, minimum=1.0),
        runner_stale_s=env_number(env, "GT_SERVICE_STALE_AFTER", 3.0, minimum=0.5),
        batch=int(env_number(env, "GT_MQ_BATCH", max(1, BATCH_PER_RUNNER * runners), minimum=1, whole=True)),
        batch_wait_s=env_number(env, "GT_MQ_BATCH_WAIT", 0.0, minimum=0.0),
        push_retries=int(env_number(env, "GT_MQ_PUSH_RETRIES", 8, minimum=0, whole=True)),
        push_backoff_s=env_number(env, "GT_MQ_PUSH_BACKOFF", 1.0, minimum=0.0),
        push_backoff_max_s=env_number(env, "GT_MQ_PUSH_BACKOFF_MAX", 60.0, minimum=0.0),
        max_bytes=int(env_number(env, "GT_MR_MAX_BYTES", 50 * 1000 * 1000, minimum=1024, whole=True)),
        gate_user=env.get("GT_GATE_USER", "").strip(),
    )
