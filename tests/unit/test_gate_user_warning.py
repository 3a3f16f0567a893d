"""`gt up` warns when agents run as their own user but the gates that run their code would run as root."""

from __future__ import annotations

from gt.town.lifecycle import gate_user_warning


def test_agents_contained_but_gates_as_root_is_warned_of() -> None:
    warning = gate_user_warning({"GT_AGENT_USER": "gt-agent"}, 0)
    assert warning is not None
    assert "GT_GATE_USER" in warning
    assert "root" in warning


def test_nothing_is_said_when_gates_have_their_own_user_or_nothing_runs_as_root() -> None:
    assert gate_user_warning({"GT_AGENT_USER": "gt-agent", "GT_GATE_USER": "gt-gate"}, 0) is None
    assert gate_user_warning({"GT_AGENT_USER": "gt-agent"}, 1000) is None, "not root: the gates are not root's"
    assert gate_user_warning({}, 0) is None, "agents as root: the docs' warning about that applies already"
    assert gate_user_warning({"GT_AGENT_USER": "  "}, 0) is None
