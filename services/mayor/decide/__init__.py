"""The mayor's decisions: (state, command, context) -> events, or a CommandError. Pure: no I/O, no clock.

Each area has its module (beads, work, convoys, mail, escalations); ``dispatch`` routes a command to it (which
commands are decided one after the other is said by each command: ``Command.ordering_key``).
"""

from services.mayor.decide.dispatch import decide

__all__ = ["decide"]
