"""Streams and consumers as data, and idempotent provisioning that never silently changes what exists (a
command consumer is only ever widened, when a newer version gives its service more commands)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import nats.js.errors
import structlog
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core.config import TownConfig
from shared.core.errors import EventLogLostError, StreamConfigMismatchError
from shared.core.subjects import CMD_PREFIX, DEFAULT_PLUGIN_BUCKET, EVT_PREFIX
from shared.model.commands import COMMANDS

log = structlog.get_logger(__name__)

MAX_EVENT_BYTES = 1024 * 1024
MAX_COMMAND_STORE_BYTES = 4 * 1024 * 1024
DUPLICATE_WINDOW_S = 120.0
ERR_STREAM_NAME_IN_USE = 10058
COMMAND_ACK_WAIT_S = 10.0
"""A command unacked this long is delivered again (after a crash, say); a copy that arrives while the first
is still being settled is ignored, so this only bounds how long a crash delays the commands it held."""
COMMAND_MAX_ACK_PENDING = 20_000

COMMAND_OWNERS: dict[str, str] = {cls.SUBJECT.split(".")[2]: cls.OWNER for cls in COMMANDS.values()}
"""Which service answers commands on ``gt.cmd.<aggregate>.<verb>``, by aggregate: each command class says its
owner (``Command.OWNER``), and every command of one aggregate has the same (``tests/unit/test_command_metadata.py``)."""
CATCH_ALL_SERVICE = "mayor"
"""Reads all of ``gt.cmd.>`` and answers ``unknown_command`` for aggregates nobody owns, so every command
gets exactly one outcome; it acks commands of other owners without answering them."""


def owner_of(subject: str) -> str:
    """The service that answers a command subject."""
    parts = subject.split(".")
    aggregate = parts[2] if len(parts) > 2 else ""
    return COMMAND_OWNERS.get(aggregate, CATCH_ALL_SERVICE)


def command_filters(service: str) -> list[str]:
    """The GT_CMD subjects the service's durable consumer reads."""
    if service == CATCH_ALL_SERVICE:
        return [f"{CMD_PREFIX}.>"]
    return sorted(f"{CMD_PREFIX}.{agg}.>" for agg, owner in COMMAND_OWNERS.items() if owner == service)


def has_command_consumer(service: str) -> bool:
    return bool(command_filters(service))


def command_consumer_name(service: str) -> str:
    return f"{service}-cmd"


def evt_stream_config(config: TownConfig) -> StreamConfig:
    return StreamConfig(
        name=config.evt_stream,
        subjects=[f"{EVT_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_msgs=-1,
        max_bytes=-1,
        max_age=0,
        max_msgs_per_subject=-1,
        max_msg_size=MAX_EVENT_BYTES,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=config.replicas,
        deny_delete=True,
        deny_purge=True,
        allow_rollup_hdrs=False,
        allow_direct=True,
        allow_atomic=True,
    )


def cmd_stream_config(config: TownConfig) -> StreamConfig:
    # Interest retention: a command stays stored until every consumer interested in its subject has acked
    # it, i.e. until its owning service has processed it. A message stored while no consumer exists is
    # dropped at once, acknowledged all the same: ``ensure_command_intake`` therefore creates the stream
    # capturing nothing, then the consumers, and only then opens the command subjects.
    return StreamConfig(
        name=config.cmd_stream,
        subjects=[f"{CMD_PREFIX}.>"],
        retention=RetentionPolicy.INTEREST,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_msgs=-1,
        max_bytes=-1,
        max_age=0,
        max_msg_size=MAX_COMMAND_STORE_BYTES,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=config.replicas,
    )


def command_consumer_config(service: str) -> ConsumerConfig:
    filters = command_filters(service)
    return ConsumerConfig(
        durable_name=command_consumer_name(service),
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=COMMAND_ACK_WAIT_S,
        max_ack_pending=COMMAND_MAX_ACK_PENDING,
        max_deliver=-1,
    )


# Fields whose difference breaks a guarantee this project relies on: what the stream captures, that it
# keeps everything (no limit may discard history), that it is immutable, and atomic batches.
_CRITICAL = (
    "subjects",
    "retention",
    "storage",
    "discard",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "deny_delete",
    "deny_purge",
    "allow_atomic",
    "num_replicas",
)
_FLAGS = ("deny_delete", "deny_purge", "allow_atomic")
_UNLIMITED = ("max_msgs", "max_bytes", "max_msgs_per_subject")


def _norm(value: object) -> object:
    if hasattr(value, "value"):
        return value.value
    if isinstance(value, list):
        return sorted(value)
    return value


def compare(existing: StreamConfig, wanted: StreamConfig) -> dict[str, tuple[object, object]]:
    diffs: dict[str, tuple[object, object]] = {}
    for field in _CRITICAL:
        want = getattr(wanted, field)
        if want is None:
            continue
        have = getattr(existing, field)
        if field in _FLAGS:
            have = bool(have)
        elif field in _UNLIMITED and have is None:
            have = -1
        elif field == "max_age" and have is None:
            have = 0
        if _norm(have) != _norm(want):
            diffs[field] = (_norm(have), _norm(want))
    return diffs


@dataclass(frozen=True, slots=True)
class ProvisionReport:
    """What ``provision`` found: names of streams and consumers it created, and of those that were there."""

    created: list[str]
    existing: list[str]


async def ensure_stream(js: JetStreamContext, wanted: StreamConfig, *, opening: StreamConfig | None = None) -> bool:
    """Create ``wanted`` if absent; return True when created. Raise on an incompatible existing stream.

    ``opening``: the configuration ``wanted`` becomes once opened (the command intake); an existing stream
    may be in either."""
    assert wanted.name
    try:
        info = await js.stream_info(wanted.name)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(wanted)
        except nats.js.errors.BadRequestError as exc:
            # Two provisioners raced: the other one created it first. Fall through to the comparison.
            if exc.err_code != ERR_STREAM_NAME_IN_USE:
                raise
        else:
            log.info("stream_created", stream=wanted.name)
            return True
        info = await js.stream_info(wanted.name)
    diffs = compare(info.config, wanted)
    if diffs and opening is not None and not compare(info.config, opening):
        return False
    if diffs:
        raise StreamConfigMismatchError(wanted.name, diffs)
    return False


async def ensure_consumer(js: JetStreamContext, stream: str, wanted: ConsumerConfig) -> bool:
    """Create the durable consumer if absent; return True when created. A consumer that reads a subset of the
    wanted subjects (a newer version gave its service more commands) is widened in place, pending commands
    kept; one that reads other subjects, or acks differently, is refused (raises)."""
    assert wanted.durable_name
    try:
        info = await js.consumer_info(stream, wanted.durable_name)
    except nats.js.errors.NotFoundError:
        await js.add_consumer(stream, wanted)
        log.info("consumer_created", stream=stream, consumer=wanted.durable_name)
        return True
    have = sorted(info.config.filter_subjects or ([info.config.filter_subject] if info.config.filter_subject else []))
    want = sorted(wanted.filter_subjects or ([wanted.filter_subject] if wanted.filter_subject else []))
    diffs: dict[str, tuple[object, object]] = {}
    if _norm(info.config.ack_policy) != _norm(wanted.ack_policy):
        diffs["ack_policy"] = (_norm(info.config.ack_policy), _norm(wanted.ack_policy))
    widen = have != want and set(have) < set(want)
    if have != want and not widen:
        diffs["filter_subjects"] = (have, want)
    if diffs:
        raise StreamConfigMismatchError(f"{stream} consumer {wanted.durable_name}", diffs)
    if widen:
        await js.add_consumer(stream, dataclasses.replace(info.config, filter_subject=None, filter_subjects=want))
        log.info("consumer_widened", stream=stream, consumer=wanted.durable_name, added=sorted(set(want) - set(have)))
    return False


ORIGIN_CUTOVER_KEY = "gt_origin_from_seq"
"""GT_CMD's metadata entry holding the first sequence stored under the rule that a command on a plain subject is an
operator's (docs/architecture.md, "Identity"). Earlier versions took the actor of such a command from its body, and
their services sent their own commands there: a command stored before a town's upgrade (a service's, waiting for
the service it is for) is settled by the rule it was sent under, so an upgrade refuses none of them."""


def origin_cutover(metadata: dict[str, str] | None) -> int:
    """The GT_CMD sequence from which commands on plain subjects are operators' (0, every one, when the stream does
    not say: the strict reading)."""
    raw = (metadata or {}).get(ORIGIN_CUTOVER_KEY, "")
    return int(raw) if raw.isdigit() else 0


async def ensure_origin_cutover(js: JetStreamContext, stream: str) -> int:
    """Record in GT_CMD's metadata, once, the sequence from which plain subjects are operators' only: the next one
    stored (1 for a new stream). Returns it."""
    info = await js.stream_info(stream)
    metadata = dict(info.config.metadata or {})
    if ORIGIN_CUTOVER_KEY in metadata:
        return origin_cutover(metadata)
    metadata[ORIGIN_CUTOVER_KEY] = str(int(info.state.last_seq) + 1)
    await js.update_stream(dataclasses.replace(info.config, metadata=metadata))
    log.info("command_origin_cutover_recorded", stream=stream, from_seq=metadata[ORIGIN_CUTOVER_KEY])
    return origin_cutover(metadata)


def closed_intake_subject(config: TownConfig) -> str:
    """What GT_CMD captures until its consumers exist: a subject nobody publishes to."""
    return f"{config.cmd_stream}.opening"


async def ensure_command_intake(js: JetStreamContext, config: TownConfig) -> tuple[list[str], list[str]]:
    """GT_CMD and its consumers, created so that no command is ever stored while nobody would keep it.

    Interest retention drops a message that arrives while the stream has no consumer, yet acknowledges it.
    So a new GT_CMD first captures only ``closed_intake_subject``: a command published then gets "no
    stream" (nothing stored, the sender is told). The consumers are created next, and only then does the
    stream capture ``gt.cmd.>``. A provisioner that died half-way leaves a closed intake; the next one
    finishes it. It also records, once, where commands on plain subjects became operators' only
    (``ORIGIN_CUTOVER_KEY``). Returns the names created and those that were there."""
    wanted = cmd_stream_config(config)
    assert wanted.name
    closed = dataclasses.replace(wanted, subjects=[closed_intake_subject(config)], metadata={ORIGIN_CUTOVER_KEY: "1"})
    created: list[str] = []
    existing: list[str] = []
    (created if await ensure_stream(js, closed, opening=wanted) else existing).append(wanted.name)
    await ensure_origin_cutover(js, wanted.name)
    for service in sorted({CATCH_ALL_SERVICE, *COMMAND_OWNERS.values()}):
        name = f"{config.cmd_stream}/{command_consumer_name(service)}"
        made = await ensure_consumer(js, config.cmd_stream, command_consumer_config(service))
        (created if made else existing).append(name)
    info = await js.stream_info(wanted.name)
    if sorted(info.config.subjects or []) != sorted(wanted.subjects or []):
        await js.update_stream(dataclasses.replace(wanted, metadata=info.config.metadata))
        log.info("command_intake_opened", stream=wanted.name, subjects=wanted.subjects)
    return created, existing


async def refuse_a_lost_log(js: JetStreamContext, config: TownConfig) -> None:
    """Raise ``EventLogLostError`` when the event log is missing from a town that had one: its command intake is
    there (provisioning makes GT_CMD only once the log exists, and nobody but the admin user may delete either), or
    a snapshot of a service is. Creating an empty log there would start an empty town over the old one's work."""
    if await _stream_exists(js, config.evt_stream):
        return
    try:
        info = await js.stream_info(config.cmd_stream)
    except nats.js.errors.NotFoundError:
        info = None
    if info is not None and not await _stream_exists(js, config.evt_stream):
        # (Looked again: another provisioner may have made both since the first look, the log first.)
        raise EventLogLostError(
            config.evt_stream,
            f"the stream is missing while the town's command intake {config.cmd_stream} (created after it, "
            f"{int(info.state.last_seq)} commands stored so far) is there",
        )
    try:
        snapshots = await js.stream_info(f"OBJ_{config.snapshot_bucket}")
    except nats.js.errors.NotFoundError:
        return
    if int(snapshots.state.messages) > 0:
        raise EventLogLostError(
            config.evt_stream, f"the stream is missing while snapshots of it are stored ({config.snapshot_bucket})"
        )


async def _stream_exists(js: JetStreamContext, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return False
    return True


@map_errors
async def missing_for_services(nc: Connection, config: TownConfig) -> list[str]:
    """What a service that does not provision (a gate runner) needs and provisioning has not made yet: the log, the
    activity keys' and the service heartbeats' buckets; [] once all are there."""
    js = nc.jetstream()
    wanted = [config.evt_stream, f"KV_{config.active_bucket}", f"KV_{config.service_bucket}"]
    return [name for name in wanted if not await _stream_exists(js, name)]


@map_errors
async def provision(nc: Connection, config: TownConfig) -> ProvisionReport:
    """Idempotently create the event log, the command intake and the command consumers, and the KV buckets (the
    plugins' marks included: ``kv_stream_config``, rollups refused, direct gets answered)."""
    js = nc.jetstream()
    created: list[str] = []
    existing: list[str] = []
    evt = evt_stream_config(config)
    assert evt.name
    await refuse_a_lost_log(js, config)
    (created if await ensure_stream(js, evt) else existing).append(evt.name)
    made_intake, had_intake = await ensure_command_intake(js, config)
    created += made_intake
    existing += had_intake
    made = await _ensure_heartbeat_bucket(js, config)
    (created if made else existing).append(f"KV {config.heartbeat_bucket}")
    made = await ensure_kv(js, config.service_bucket, ttl=SERVICE_HEARTBEAT_TTL_S, replicas=config.replicas)
    (created if made else existing).append(f"KV {config.service_bucket}")
    made = await ensure_kv(
        js, config.lease_bucket, ttl=LEASE_RENEWAL_TTL_S, replicas=config.replicas, written_by_sessions=True
    )
    (created if made else existing).append(f"KV {config.lease_bucket}")
    made = await ensure_kv(js, config.active_bucket, ttl=ACTIVE_KEY_TTL_S, replicas=config.replicas)
    (created if made else existing).append(f"KV {config.active_bucket}")
    # The plugins' marks and positions: made here, since plugins (account PLUGINS) may not create a stream.
    made = await ensure_kv(js, DEFAULT_PLUGIN_BUCKET, ttl=PLUGIN_MARK_TTL_S, replicas=config.replicas)
    (created if made else existing).append(f"KV {DEFAULT_PLUGIN_BUCKET}")
    for bucket in rollup_free_buckets(config):
        await deny_rollups(js, bucket)
    return ProvisionReport(created=created, existing=existing)


HEARTBEAT_TTL_S = 24 * 3600.0
"""Heartbeats are only ever read while fresh; a day of them is plenty."""


LEASE_RENEWAL_TTL_S = 8 * 24 * 3600.0
"""Longer than the longest lease TTL (a week): a live lease's renewal entry never ages out."""
SERVICE_HEARTBEAT_TTL_S = 3600.0
"""A service process gone for an hour leaves the bucket by itself (its down event stays in the log)."""
PLUGIN_MARK_TTL_S = 7 * 24 * 3600.0
"""How long the plugins' marks are kept (``shared.plugins.settings.DEFAULT_MARK_TTL_S``); their positions are written
never to age out (``log_read.put_kept``)."""
ACTIVE_KEY_TTL_S = 3600.0
"""A scope's activity key is renewed every few seconds while held; one left by a scope nobody runs any more
leaves the bucket after an hour (a lapsed key is taken over long before, by its revision, not by this)."""


@map_errors
async def ensure_heartbeat_bucket(nc: Connection, config: TownConfig) -> bool:
    """The KV bucket of agent heartbeats (a cache of liveness, never truth); True when created."""
    return await _ensure_heartbeat_bucket(nc.jetstream(), config)


async def _ensure_heartbeat_bucket(js: JetStreamContext, config: TownConfig) -> bool:
    return await ensure_kv(
        js, config.heartbeat_bucket, ttl=HEARTBEAT_TTL_S, replicas=config.replicas, written_by_sessions=True
    )


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, ttl: float, replicas: int, written_by_sessions: bool = False
) -> bool:
    """A KV bucket keeping the latest value per key; True when this call created it.

    ``written_by_sessions``: polecat sessions write their own keys (heartbeats, hook leases), each allowed only
    its key's subjects (shared/model/session_identity.py). Such a bucket answers direct gets (the only read that names
    one key in its subject, so a permission can scope it) and refuses rollup headers: permissions cannot look
    at headers, and a ``Nats-Rollup: all`` published on a session's own key would wipe every key. An existing
    bucket is brought to that (the deacon deletes stale keys with a compare-and-set, never a rollup).
    """
    try:
        await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        try:
            await create_kv(js, bucket, ttl=ttl, replicas=replicas)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            return False
        log.info("bucket_created", bucket=bucket)
        return True
    if written_by_sessions:
        await deny_rollups(js, bucket)
    return False


def rollup_free_buckets(config: TownConfig) -> tuple[str, ...]:
    """The buckets whose streams refuse rollup headers: every KV bucket of the town. What matters are those
    clients other than the services write (agents their hook lease and heartbeat, plugins their marks).

    A message with ``Nats-Rollup: all`` (``KV-Operation: PURGE``) published to any key a client may write
    replaced a whole bucket by that one marker, and publish permissions cannot look at headers. Nothing of the
    town needs a rollup on these: the deacon's sweep deletes with a compare-and-set and then purges the
    subject through the stream API (``kv.Bucket.purge_unless_written_since``), a plugin forgets its marks by a
    filtered stream purge. (The others are written by the services alone, which may purge any stream anyway.)"""
    return (
        config.lease_bucket,
        config.heartbeat_bucket,
        config.service_bucket,
        config.active_bucket,
        DEFAULT_PLUGIN_BUCKET,
    )


def kv_stream_config(bucket: str, *, ttl: float, replicas: int, history: int = 1) -> StreamConfig:
    """The stream of a KV bucket as nats-py's ``create_key_value`` makes it, except that it refuses rollups
    (see ``rollup_free_buckets``): made in one step, so no client ever sees the bucket allowing them."""
    kv = KeyValueConfig(bucket=bucket, history=history, ttl=ttl, replicas=replicas)
    return StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        # Direct gets name the key in their subject, so a session's permission can allow its own key only.
        allow_direct=True,
        allow_rollup_hdrs=False,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        duplicate_window=min(DUPLICATE_WINDOW_S, ttl) if ttl else DUPLICATE_WINDOW_S,
        max_age=ttl,
        max_bytes=kv.max_bytes,
        max_consumers=-1,
        max_msg_size=kv.max_value_size,
        max_msgs=-1,
        max_msgs_per_subject=history,
        num_replicas=replicas,
        storage=kv.storage,
    )


async def create_kv(js: JetStreamContext, bucket: str, *, ttl: float, replicas: int) -> KeyValue:
    """Create the bucket (raises BadRequestError ``ERR_STREAM_NAME_IN_USE`` when another one did first)."""
    await js.add_stream(kv_stream_config(bucket, ttl=ttl, replicas=replicas))
    # In a cluster the stream just made may not be found for a moment (its leader being elected, or the client
    # reconnected to another node meanwhile): a service that took it for missing stopped at start-up.
    for attempt in range(1, CREATED_VISIBLE_ATTEMPTS + 1):
        try:
            return await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            if attempt == CREATED_VISIBLE_ATTEMPTS:
                raise
            await asyncio.sleep(0.1 * attempt)
    raise AssertionError("unreachable")


CREATED_VISIBLE_ATTEMPTS = 10
"""How often a bucket just created is looked up before it is taken for missing (about 5 s in all)."""


async def deny_rollups(js: JetStreamContext, bucket: str) -> bool:
    """Make an existing bucket's stream refuse rollups and answer direct gets (one made by an older version, or
    by nats-py's defaults); True when it was changed. A bucket that is not there is left to whoever creates it."""
    try:
        info = await js.stream_info(f"KV_{bucket}")
    except nats.js.errors.NotFoundError:
        return False
    if info.config.allow_direct and not info.config.allow_rollup_hdrs:
        return False
    await js.update_stream(dataclasses.replace(info.config, allow_direct=True, allow_rollup_hdrs=False))
    log.info("bucket_rollups_denied", bucket=bucket)
    return True
