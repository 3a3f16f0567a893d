"""Per-actor rate limits and volume quotas of the command intake. Pure: the caller passes ``now`` (seconds,
monotonic).

Every actor has two token buckets per class of actor: commands per second and command bytes per second, each
with a burst. A command over either is refused (``rate_limited``), with the seconds after which it would pass.
An agent's command (``polecat:*``, ``plugin:*``) is also refused (``too_large``) over a smaller size than the
intake's 1 MiB, which bounds the text an agent writes into the log in one command.

A refusal is an event too, so refusals are bounded as well: each actor has a third bucket, with the settings of
its command bucket, for the refusals that are recorded. An actor that floods past it has its further commands
dropped without an outcome (acknowledged, counted, logged), and the next recorded refusal says how many were
dropped. Stored outcomes of one actor over ``t`` seconds are thus at most twice ``burst + rate * t``, however
fast it sends.

Services (``mayor``, ``witness``, ``refinery``, ``deacon`` and their scopes, and the deacon's ``automation:*``)
are not limited: their commands are the town's own traffic. The intake says which class a command is charged
under, from the subject it came on (a polecat session's, a service's, or a plain one: an operator's), never from
what its body says.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import msgspec

from shared.core.config import env_number
from shared.core.errors import CommandError
from shared.model.commands import Command
from shared.model.commands.actors import ActorClass, actor_class
from shared.service.intake.delivery import Delivery

MAX_BUCKETS = 10_000
"""Buckets kept before full (idle) ones are forgotten: many actor names cannot grow the limiter's memory."""


class Limit(msgspec.Struct, frozen=True, kw_only=True):
    """``rate`` per second, up to ``burst`` at once; a rate of 0 is no limit."""

    rate: float
    burst: float

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0


NO_LIMIT = Limit(rate=0, burst=0)


class ClassLimits(msgspec.Struct, frozen=True, kw_only=True):
    commands: Limit = NO_LIMIT
    """Commands per second."""
    volume: Limit = NO_LIMIT
    """Bytes of command bodies per second."""
    max_command_bytes: int = 0
    """The largest command body (0: the intake's own limit)."""


class RateSettings(msgspec.Struct, frozen=True, kw_only=True):
    agent: ClassLimits = ClassLimits(
        commands=Limit(rate=20, burst=100),
        volume=Limit(rate=16 * 1024, burst=1024 * 1024),
        max_command_bytes=32 * 1024,
    )
    operator: ClassLimits = ClassLimits(commands=Limit(rate=1_000, burst=20_000))

    def of(self, cls: ActorClass) -> ClassLimits:
        if cls == "agent":
            return self.agent
        if cls == "operator":
            return self.operator
        return ClassLimits()


def load(env: Mapping[str, str] | None = None) -> RateSettings:
    """``GT_RATE_<CLASS>``, ``GT_RATE_<CLASS>_BURST``, ``GT_RATE_<CLASS>_BYTES``, ``GT_RATE_<CLASS>_BYTES_BURST``
    (class AGENT or OPERATOR; 0: no limit) and ``GT_RATE_AGENT_MAX_COMMAND``. Raises ValueError naming a
    setting whose value cannot be used."""
    env = os.environ if env is None else env
    default = RateSettings()

    def of_class(name: str, given: ClassLimits) -> ClassLimits:
        key = f"GT_RATE_{name}"
        return ClassLimits(
            commands=limit_from_env(env, key, given.commands),
            volume=limit_from_env(env, f"{key}_BYTES", given.volume),
            max_command_bytes=int(
                env_number(env, f"{key}_MAX_COMMAND", given.max_command_bytes, minimum=0, whole=True)
            ),
        )

    return RateSettings(agent=of_class("AGENT", default.agent), operator=of_class("OPERATOR", default.operator))


def limit_from_env(env: Mapping[str, str], key: str, given: Limit) -> Limit:
    """``key`` (per second; 0: no limit) and ``<key>_BURST`` from ``env``, else ``given``'s (a burst never below the
    rate). Raises ValueError naming a setting whose value cannot be used."""
    rate = env_number(env, key, given.rate, minimum=0)
    burst = env_number(env, f"{key}_BURST", max(given.burst, rate), minimum=max(rate, 1) if rate else 0)
    return Limit(rate=rate, burst=burst)


class Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at

    def refill(self, limit: Limit, now: float) -> None:
        self.tokens = min(limit.burst, self.tokens + max(0.0, now - self.at) * limit.rate)
        self.at = now

    def wait_for(self, limit: Limit, cost: float) -> float:
        """Seconds until ``cost`` tokens are there (inf: never, over the burst)."""
        if cost > limit.burst:
            return math.inf
        return max(0.0, (cost - self.tokens) / limit.rate)


class ActorBuckets:
    __slots__ = ("cls", "commands", "dropped", "refusals", "volume")

    def __init__(self, cls: ActorClass, limits: ClassLimits, now: float) -> None:
        self.cls = cls
        self.commands = Bucket(limits.commands.burst, now)
        self.volume = Bucket(limits.volume.burst, now)
        self.refusals = Bucket(limits.commands.burst, now)
        self.dropped = 0


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """``admit``: carry it out. Else ``code`` and ``message`` are the refusal to record, or, ``drop``, the
    command is dropped without an outcome (its actor is far over its limit)."""

    admit: bool = True
    drop: bool = False
    code: str = ""
    message: str = ""


ADMIT = Verdict()
DROP = Verdict(admit=False, drop=True)


class RateLimiter:
    def __init__(self, settings: RateSettings | None = None) -> None:
        self.settings = settings or RateSettings()
        self._buckets: dict[tuple[ActorClass, str], ActorBuckets] = {}
        self.dropped = 0
        """Commands dropped without an outcome, in total."""

    def check(self, actor: str, size: int, now: float, *, cls: ActorClass | None = None) -> Verdict:
        """Charge ``actor`` of class ``cls`` (the intake's, from the command's subject; else its name's) for one
        command of ``size`` bytes at ``now`` and say what becomes of it."""
        cls = actor_class(actor) if cls is None else cls
        limits = self.settings.of(cls)
        if cls == "service":
            return ADMIT
        if limits.max_command_bytes and size > limits.max_command_bytes:
            # Not charged: it writes nothing. Refused like any refusal, so bounded like one.
            return self._refuse(actor, cls, limits, now, "too_large", self._too_large(cls, size, limits))
        if limits.commands.unlimited and limits.volume.unlimited:
            return ADMIT
        buckets = self._of(actor, cls, limits, now)
        wait = 0.0
        if not limits.commands.unlimited:
            buckets.commands.refill(limits.commands, now)
            wait = buckets.commands.wait_for(limits.commands, 1)
        if not limits.volume.unlimited:
            buckets.volume.refill(limits.volume, now)
            wait = max(wait, buckets.volume.wait_for(limits.volume, size))
        if wait > 0:
            return self._refuse(actor, cls, limits, now, "rate_limited", self._over(actor, cls, size, limits, wait))
        if not limits.commands.unlimited:
            buckets.commands.tokens -= 1
        if not limits.volume.unlimited:
            buckets.volume.tokens -= size
        return ADMIT

    def _refuse(self, actor: str, cls: ActorClass, limits: ClassLimits, now: float, code: str, message: str) -> Verdict:
        buckets = self._of(actor, cls, limits, now)
        if not limits.commands.unlimited:
            buckets.refusals.refill(limits.commands, now)
            if buckets.refusals.tokens < 1:
                buckets.dropped += 1
                self.dropped += 1
                return DROP
            buckets.refusals.tokens -= 1
        if buckets.dropped:
            message += (
                f" ({buckets.dropped} more commands from {actor} were dropped without an outcome: "
                "it sent them far over its limit)"
            )
            buckets.dropped = 0
        return Verdict(admit=False, code=code, message=message)

    def _of(self, actor: str, cls: ActorClass, limits: ClassLimits, now: float) -> ActorBuckets:
        # Keyed by class too: an operator labelled like an agent never shares (or spends) the agent's buckets.
        found = self._buckets.get((cls, actor))
        if found is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_idle(now)
            found = self._buckets[(cls, actor)] = ActorBuckets(cls, limits, now)
        return found

    def _forget_idle(self, now: float) -> None:
        """Forget actors whose buckets have refilled: a fresh bucket is full, so nothing changes for them."""
        for key, buckets in list(self._buckets.items()):
            limits = self.settings.of(buckets.cls)
            idle_s = max(
                limits.commands.burst / limits.commands.rate if not limits.commands.unlimited else 0.0,
                limits.volume.burst / limits.volume.rate if not limits.volume.unlimited else 0.0,
            )
            if not buckets.dropped and now - max(buckets.commands.at, buckets.volume.at) >= idle_s:
                del self._buckets[key]

    @staticmethod
    def _over(actor: str, cls: ActorClass, size: int, limits: ClassLimits, wait: float) -> str:
        what = []
        if not limits.commands.unlimited:
            what.append(f"{limits.commands.rate:g} commands/s, bursts of {limits.commands.burst:g}")
        if not limits.volume.unlimited:
            what.append(f"{limits.volume.rate:g} bytes/s, bursts of {limits.volume.burst:g}")
        retry = (
            f"the command ({size} bytes) is larger than the burst: send less"
            if math.isinf(wait)
            else f"send it again in {wait:.2f} s"
        )
        return (
            f"{actor} sends commands faster than an {cls} may ({'; '.join(what)}; GT_RATE_{cls.upper()}*): "
            f"nothing was done; {retry}"
        )

    @staticmethod
    def _too_large(cls: ActorClass, size: int, limits: ClassLimits) -> str:
        return (
            f"the command is {size} bytes; an {cls}'s commands are limited to {limits.max_command_bytes} bytes "
            f"(GT_RATE_{cls.upper()}_MAX_COMMAND): shorten the text, or put it in a file in the worktree and "
            "name the file"
        )


def admit(
    limiter: RateLimiter | None, delivery: Delivery, parsed: Command | CommandError, now: float
) -> Command | CommandError | None:
    """The rate-limit step, before deciding: the command as it was, a refusal (``rate_limited``, ``too_large``) in
    its place, or None to drop it without an outcome (docs/operating.md, "Rate limits"). Charged where it is
    settled (a command passed on to another scope is not charged by this one), and not when a dead predecessor
    held it: that one charged it. A redelivery whose outcome is stored is answered by that outcome all the same
    (settling looks for it first)."""
    if limiter is None or delivery.held:
        return parsed
    verdict = limiter.check(delivery.actor, len(delivery.body), now, cls=delivery.actor_class)
    if verdict.admit:
        return parsed
    if verdict.drop:
        return None
    return CommandError(verdict.code, verdict.message)
