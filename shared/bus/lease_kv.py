"""Holding a lease: renew it in the ``GT_LEASES`` KV bucket (``shared.bus.kv.Bucket``). Who acquires and releases
it depends on the lease: an operator's through the deacon's commands, a hook (``hook-*``) by the witness and a
merge lease (``merge-*``) by the refinery, each appending ``lease.acquired``/``lease.released`` itself.

Renewals compare-and-set the bucket entry, and the deacon marks an entry expired (also compare-and-set) before
it records ``lease.expired``: a renewal racing an expiry either lands first (and the lease lives) or finds the
mark and fails with ``LeaseLostError``. Commands sent while holding the lease carry ``fence`` and are refused
once the lease is lost (see ``shared.bus.fencing``). The lease as the log records it, the entry's record
(``Renewal``) and the rules of both are pure, in ``shared.model.leases``.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.bus.errors import map_errors
from shared.bus.kv import Bucket
from shared.core.decoding import UNDECODABLE
from shared.core.errors import GastownError
from shared.model.leases import Renewal as Renewal

CAS_ATTEMPTS = 5
_DECODER = msgspec.json.Decoder(Renewal)


class LeaseLostError(GastownError):
    """The lease expired or passed to another holder: stop acting on it."""

    def __init__(self, lease: str, token: int, why: str) -> None:
        super().__init__(f"lease {lease} token {token} is lost: {why}")
        self.lease = lease
        self.token = token
        self.why = why


def decode_renewal(data: bytes | None) -> Renewal | None:
    if not data:
        return None
    try:
        return _DECODER.decode(data)
    except UNDECODABLE:
        return None


@map_errors
async def read(kv: Bucket, lease: str) -> tuple[Renewal | None, int]:
    """The lease's renewal entry and its revision (0: none)."""
    entry = await kv.get(lease)
    if entry is None:
        return None, 0
    return decode_renewal(entry.value), entry.revision


async def _put(kv: Bucket, lease: str, value: Renewal, revision: int) -> bool:
    """Compare-and-set; False when someone wrote the entry since ``revision``."""
    data = msgspec.json.encode(value)
    if revision:
        return await kv.update(lease, data, last=revision)
    return await kv.create(lease, data)


@map_errors
async def renew(kv: Bucket, lease: str, holder: str, token: int, now: datetime) -> None:
    """Renew (raises ``LeaseLostError`` if the lease expired or has a newer holder)."""
    for _ in range(CAS_ATTEMPTS):
        current, revision = await read(kv, lease)
        if current is not None and current.token > token:
            raise LeaseLostError(lease, token, f"{current.holder} holds it with token {current.token}")
        if current is not None and current.token == token and current.expired:
            raise LeaseLostError(lease, token, "the deacon expired it")
        if await _put(kv, lease, Renewal(holder=holder, token=token, renewed_at=now), revision):
            return
    raise LeaseLostError(lease, token, "the renewal kept racing other writers")


@map_errors
async def mark_expired(
    kv: Bucket, lease: str, holder: str, token: int, last_renewed: datetime, *, seen_revision: int
) -> bool:
    """The deacon's half: mark the entry expired unless it changed since the deacon looked (a renewal came)."""
    mark = Renewal(holder=holder, token=token, renewed_at=last_renewed, expired=True)
    return await _put(kv, lease, mark, seen_revision)
