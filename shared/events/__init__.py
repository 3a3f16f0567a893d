"""Every event type this project stores, and the registry that decodes them."""

from shared.events.automations import AUTOMATION_EVENTS, AutomationCompleted, AutomationFailed, AutomationFired
from shared.events.base import (
    Envelope,
    Event,
    EventRef,
    EventRegistry,
    decode_envelope,
    encode_event,
)
from shared.events.beads import (
    BEAD_EVENTS,
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadEvent,
    BeadHeld,
    BeadSlung,
    BeadUnslung,
    BeadUpdated,
)
from shared.events.convoys import CONVOY_EVENTS, ConvoyBeadsAdded, ConvoyClosed, ConvoyCreated
from shared.events.escalations import (
    ESCALATION_EVENTS,
    EscalationAcked,
    EscalationClosed,
    EscalationRaised,
    EscalationReescalated,
)
from shared.events.gc import GC_EVENTS, GcSwept
from shared.events.leases import LEASE_EVENTS, LeaseAcquired, LeaseExpired, LeaseReleased
from shared.events.merge_requests import (
    MERGE_REQUEST_EVENTS,
    MergeRequestClaimed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestRequeued,
    MergeRequestSubmitted,
)
from shared.events.molecules import (
    MOLECULE_EVENTS,
    MoleculeAttached,
    MoleculeCompleted,
    ReworkAdded,
    StepCompleted,
    StepSpec,
    StepStarted,
)
from shared.events.nudges import NUDGE_EVENTS, NudgeDelivered, NudgeExpired, NudgeQueued
from shared.events.outcomes import (
    OUTCOME_EVENTS,
    REJECTION_CODES,
    CommandAccepted,
    CommandOutcome,
    CommandRejected,
)
from shared.events.rigs import RIG_EVENTS, RigAdded, RigMassDeath, RigParked, RigRemoved, RigUnparked, RigUpdated
from shared.events.services import SERVICE_EVENTS, ServiceDown, ServiceStopped, ServiceUp
from shared.events.sessions import (
    DEATHS,
    SESSION_EVENTS,
    SessionCleaned,
    SessionDoneIntent,
    SessionEnded,
    SessionEscalated,
    SessionHookRecovered,
    SessionRequested,
    SessionStarted,
    SessionWarranted,
)
from shared.events.usage import USAGE_EVENTS, SessionUsage

REGISTRY = EventRegistry(
    (
        *BEAD_EVENTS,
        *MOLECULE_EVENTS,
        *CONVOY_EVENTS,
        *ESCALATION_EVENTS,
        *RIG_EVENTS,
        *SESSION_EVENTS,
        *NUDGE_EVENTS,
        *MERGE_REQUEST_EVENTS,
        *OUTCOME_EVENTS,
        *AUTOMATION_EVENTS,
        *SERVICE_EVENTS,
        *LEASE_EVENTS,
        *GC_EVENTS,
        *USAGE_EVENTS,
    )
)
"""The registry services decode with."""

__all__ = [
    "DEATHS",
    "REGISTRY",
    "REJECTION_CODES",
    "AutomationCompleted",
    "AutomationFailed",
    "AutomationFired",
    "BeadClaimed",
    "BeadClosed",
    "BeadCreated",
    "BeadEvent",
    "BeadHeld",
    "BeadSlung",
    "BeadUnslung",
    "BeadUpdated",
    "CommandAccepted",
    "CommandOutcome",
    "CommandRejected",
    "ConvoyBeadsAdded",
    "ConvoyClosed",
    "ConvoyCreated",
    "Envelope",
    "EscalationAcked",
    "EscalationClosed",
    "EscalationRaised",
    "EscalationReescalated",
    "Event",
    "EventRef",
    "EventRegistry",
    "GcSwept",
    "LeaseAcquired",
    "LeaseExpired",
    "LeaseReleased",
    "MergeRequestClaimed",
    "MergeRequestConflicted",
    "MergeRequestFailed",
    "MergeRequestMerged",
    "MergeRequestRejected",
    "MergeRequestRequeued",
    "MergeRequestSubmitted",
    "MoleculeAttached",
    "MoleculeCompleted",
    "NudgeDelivered",
    "NudgeExpired",
    "NudgeQueued",
    "ReworkAdded",
    "RigAdded",
    "RigMassDeath",
    "RigParked",
    "RigRemoved",
    "RigUnparked",
    "RigUpdated",
    "ServiceDown",
    "ServiceStopped",
    "ServiceUp",
    "SessionCleaned",
    "SessionDoneIntent",
    "SessionEnded",
    "SessionEscalated",
    "SessionHookRecovered",
    "SessionRequested",
    "SessionStarted",
    "SessionUsage",
    "SessionWarranted",
    "StepCompleted",
    "StepSpec",
    "StepStarted",
    "decode_envelope",
    "encode_event",
]
