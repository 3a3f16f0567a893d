"""Every event type this project stores, and the registry that decodes them."""

from shared.events.base import (
    Envelope,
    Event,
    EventRef,
    EventRegistry,
    decode_envelope,
    encode_event,
)
from shared.events.beads import BEAD_EVENTS, BeadClaimed, BeadClosed, BeadCreated, BeadEvent, BeadUpdated
from shared.events.outcomes import (
    OUTCOME_EVENTS,
    REJECTION_CODES,
    CommandAccepted,
    CommandOutcome,
    CommandRejected,
)

REGISTRY = EventRegistry((*BEAD_EVENTS, *OUTCOME_EVENTS))
"""The registry services decode with."""

__all__ = [
    "REGISTRY",
    "REJECTION_CODES",
    "BeadClaimed",
    "BeadClosed",
    "BeadCreated",
    "BeadEvent",
    "BeadUpdated",
    "CommandAccepted",
    "CommandOutcome",
    "CommandRejected",
    "Envelope",
    "Event",
    "EventRef",
    "EventRegistry",
    "decode_envelope",
    "encode_event",
]
