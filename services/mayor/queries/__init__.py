"""Answers to ``gt.q.mayor.<name>``, read from the projection. Pure: no I/O (formulas come in as a lookup).

``answer`` dispatches a typed query (``dispatch.py``) to the module of its kind: ``beads``, ``work`` (molecules and
convoys), ``mail`` (mail, escalations, and what a polecat session may read), ``costs``; ``views`` shows records,
``pages`` cuts a list into pages. This face only re-exports.
"""

from __future__ import annotations

from services.mayor.queries.dispatch import answer
from services.mayor.queries.mail import check_session_query, mail_visible_to, session_address
from services.mayor.queries.views import Sees, convoy_view, everything, molecule_view

__all__ = [
    "Sees",
    "answer",
    "check_session_query",
    "convoy_view",
    "everything",
    "mail_visible_to",
    "molecule_view",
    "session_address",
]
