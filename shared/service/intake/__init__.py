"""The command intake: consume a service's commands from GT_CMD and end each in exactly one outcome event.

One module per job: ``consumer`` (fetch, flow control, dispatch in order per aggregate), ``delivery`` and
``identity`` (who sent a command, what its body may claim), ``held`` (what a dead predecessor held),
``rate_limit``, ``settle`` (decide, append, retry; the outcome), ``poison`` (failures, set-aside), and
``handler``: the ``CommandHandler`` protocol a service implements for it.
"""

from __future__ import annotations

from shared.model.commands.actors import is_service
from shared.service.intake.consumer import CommandIntake
from shared.service.intake.delivery import Delivery
from shared.service.intake.handler import CommandHandler
from shared.service.intake.identity import OPERATOR, Sender, command_actor, impersonation
from shared.service.intake.settle import to_pending

__all__ = [
    "OPERATOR",
    "CommandHandler",
    "CommandIntake",
    "Delivery",
    "Sender",
    "command_actor",
    "impersonation",
    "is_service",
    "to_pending",
]
