"""Active and standby instances of a service scope: the rules, as pure functions of what was seen and when.

Any number of instances of one scope (``mayor``, ``witness``, ``witness-east``, ...) may run: each follows the
log, but only the one holding the scope's key in the ``GT_ACTIVE`` KV bucket acts (takes commands, reconciles,
writes events). The holder renews the key every third of its TTL (compare-and-set on its own last revision);
the others poll it and take it over (compare-and-set on the revision they saw) once it lapsed.

Durations are measured on each process's own monotonic clock; two machines' clocks are never compared:

- a standby counts the key as lapsed once it has seen the *same* revision for the holder's whole TTL (every
  renewal writes a new revision);
- the holder stops acting two thirds of a TTL after it *sent* its last renewal that succeeded.

The revision a standby waits on was written after the holder sent it, so the holder has stopped acting at
least a third of a TTL before any standby can take over: that third is the margin for a step already running
(a git or tmux call in a thread) to end. A holder that stops cleanly marks the key released; a standby then
waits only that margin. A holder whose process is seen dead on the standby's own machine (same boot and pid
namespace, pid and start time checked) is taken over at once: a dead process acts no more.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.core.decoding import UNDECODABLE

STOP_FRACTION = 2 / 3
"""The holder stops acting this share of a TTL after sending its last successful renewal."""
RENEW_FRACTION = 1 / 3
RETRY_FRACTION = 1 / 12
"""After a failed renewal the holder tries again this often (share of a TTL) until it must stop."""
MAX_POLL_S = 1.0
MIN_TTL_S = 0.5


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a scope's key: who holds it, and what it promised (its TTL)."""

    identity: str
    """The scope: ``mayor``, ``witness``, ``witness-east``, ..."""
    instance: str
    """The holding process, as its heartbeats name it (``<pid>-<random>``)."""
    host: str
    pid: int
    pid_started: float
    """The holder's process start time (seconds since the epoch), to tell it from a later process with its pid."""
    machine: str = ""
    """Where ``pid`` means something: the boot id and pid namespace of the holder ("" unknown)."""
    ttl_s: float
    since: datetime
    """When this instance became active (its clock; shown to operators)."""
    renewed_at: datetime
    """Its last renewal (its clock; shown to operators, never used to judge a lapse)."""
    released: bool = False
    """Set by a holder that stopped cleanly: it acts no more, a standby need only wait the margin."""


class Timing(msgspec.Struct, frozen=True, kw_only=True):
    ttl_s: float

    @property
    def renew_every(self) -> float:
        return self.ttl_s * RENEW_FRACTION

    @property
    def retry_every(self) -> float:
        return max(0.05, self.ttl_s * RETRY_FRACTION)

    @property
    def stop_after(self) -> float:
        """Seconds after sending its last successful renewal by which the holder has stopped acting."""
        return self.ttl_s * STOP_FRACTION

    @property
    def poll_every(self) -> float:
        """How often a standby reads the key."""
        return min(MAX_POLL_S, max(0.05, self.ttl_s / 10))


class Seen(msgspec.Struct, frozen=True, kw_only=True):
    """A revision of the key as a standby saw it, and since when (its monotonic clock)."""

    holder: Holder | None
    """None: the value could not be read (then it is judged by the standby's own TTL)."""
    revision: int
    since: float


class Take(msgspec.Struct, frozen=True, kw_only=True):
    """Write the key now, compare-and-set on ``revision`` (0: create it, it is absent)."""

    revision: int
    why: str


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """Stay standby; the key lapses at ``until`` (monotonic) unless it is renewed before."""

    until: float


def observe(previous: Seen | None, holder: Holder | None, revision: int, now: float) -> Seen | None:
    """What the standby knows after reading the key (``revision`` 0: absent or deleted). A new revision starts
    the wait over; the same one keeps the moment it was first seen."""
    if revision <= 0:
        return None
    if previous is not None and previous.revision == revision:
        return previous
    return Seen(holder=holder, revision=revision, since=now)


def decide(seen: Seen | None, now: float, *, me: str, holder_gone: bool, own_ttl_s: float) -> Take | Wait:
    """Whether a standby takes the key now. ``holder_gone``: the holder's process was seen dead on this machine."""
    if seen is None:
        return Take(revision=0, why="nobody holds it")
    holder = seen.holder
    if holder is not None and holder.instance == me:
        # Our own write landed though its reply was lost: renew it to know when it was sent.
        return Take(revision=seen.revision, why="it is ours")
    if holder_gone:
        return Take(revision=seen.revision, why=f"its holder {holder.instance if holder else '?'} is not running")
    ttl = holder.ttl_s if holder is not None else own_ttl_s
    quiet = ttl * (1 - STOP_FRACTION) if holder is not None and holder.released else ttl
    until = seen.since + quiet
    if now >= until:
        if holder is not None and holder.released:
            return Take(revision=seen.revision, why=f"{holder.instance} released it")
        return Take(revision=seen.revision, why=f"not renewed for {now - seen.since:.1f}s (TTL {ttl:g}s)")
    return Wait(until=until)


def deadline(sent_at: float, timing: Timing) -> float:
    """When the holder must have stopped acting, given when it sent its last successful renewal."""
    return sent_at + timing.stop_after


_DECODER = msgspec.json.Decoder(Holder)


def encode(holder: Holder) -> bytes:
    return msgspec.json.encode(holder)


def decode(data: bytes | None) -> Holder | None:
    """None for a value that is not a holder (it is then judged by the reader's own TTL)."""
    if not data:
        return None
    try:
        return _DECODER.decode(data)
    except UNDECODABLE:
        return None
