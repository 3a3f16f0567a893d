"""``ci`` gates: the check of a molecule's current step whose gate is a CI command is run every ``poll_s`` (never two
runs of one gate at once) until it exits 0, when the deacon has the mayor open the gate (``gt.cmd.gate.open``). The
deacon tracks only molecules with such a gate, of beads not closed (``DeaconState.ci_gates``). Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

import msgspec

from shared.core.ids import is_valid_id, stable_digest_id
from shared.model.events import CiGate
from shared.model.gates import MoleculeGates


class CiCheck(msgspec.Struct, frozen=True, kw_only=True):
    bead: str
    step: str
    command: str
    vars: dict[str, str] = {}
    """The molecule's vars: the command's environment ``GT_VAR_<name>``."""

    @property
    def key(self) -> tuple[str, str]:
        return self.bead, self.step

    @property
    def command_id(self) -> str:
        """The opening's command id: one per gate, so a resend (or a second deacon's) is carried out once."""
        raw = f"gate-ci-{self.bead}-{self.step}"
        return raw if is_valid_id(raw) else stable_digest_id(raw, prefix="gate-ci")


def checks_due(
    ci_gates: Mapping[str, MoleculeGates],
    now: datetime,
    last_run: Mapping[tuple[str, str], datetime],
    running: Collection[tuple[str, str]],
    poll_s: float,
) -> list[CiCheck]:
    """The checks to run now: of each molecule waiting on a ``ci`` gate, not running, last run ``poll_s`` ago or
    never (``last_run``: when each gate's last run began)."""
    due = []
    for bead, gates in ci_gates.items():
        waiting = gates.waiting()
        if waiting is None or not isinstance(waiting[1], CiGate):
            continue
        check = CiCheck(bead=bead, step=waiting[0], command=waiting[1].command, vars=dict(waiting[1].vars))
        last = last_run.get(check.key)
        if check.key in running or (last is not None and (now - last).total_seconds() < poll_s):
            continue
        due.append(check)
    return due
