"""Which query class each ``gt.q.<service>.<name>`` is, and a request's body decoded into it: the service's side of
``Query`` (the client builds the same class). msgspec checks every field's type and bound; a body it refuses is an
``invalid`` query, a name no class has an ``unknown_query``."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from shared.core import subjects
from shared.core.errors import QueryError
from shared.model.queries import deacon, mayor, refinery, witness
from shared.model.queries.base import Digest, Query, Status

BY_SERVICE: dict[str, dict[str, type[Query[Any]]]] = {
    "mayor": {q.NAME: q for q in mayor.QUERIES},
    "witness": {q.NAME: q for q in witness.QUERIES},
    "refinery": {q.NAME: q for q in refinery.QUERIES},
    "deacon": {q.NAME: q for q in deacon.QUERIES},
}
"""Service -> query name -> its class (``status`` and ``digest`` aside: every service answers those)."""
EVERY_SERVICE: dict[str, type[Query[Any]]] = {Status.NAME: Status, Digest.NAME: Digest}
_PATH = re.compile(r"`\$\.([^`]+)`")


def names(service: str) -> list[str]:
    """What ``service`` answers, as its unknown-query error lists them."""
    return [*BY_SERVICE.get(service, {}), *EVERY_SERVICE]


def decode(service: str, name: str, body: dict[str, Any]) -> Query[Any]:
    """The query ``gt.q.<service>.<name>`` with ``body`` (a JSON object's fields; unknown ones are ignored).

    Raises:
        QueryError: ``unknown_query`` when the service has no such query, ``invalid`` when a field is missing or
            of the wrong type or bound.
    """
    kind = EVERY_SERVICE.get(name) or BY_SERVICE.get(service, {}).get(name)
    if kind is None:
        known = ", ".join(names(service))
        raise QueryError("unknown_query", f"the {service} has no query {name!r}; it answers {known}")
    if kind is Status or kind is Digest:
        body = {**body, "service": service}  # whom it asks: the subject names it, the body does not
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        # msgspec names the field as a path (`$.limit`); the body's key is what the asker typed.
        problem = _PATH.sub(r"`\1`", str(exc))
        raise QueryError("invalid", f"{subjects.query_subject(service, name)}: {problem}") from None
