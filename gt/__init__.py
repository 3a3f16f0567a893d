"""The clients of a town: the ``gt`` command (``gt.cli``), the web dashboard (``gt.dashboard``), the ``gt up``
supervisor (``gt.town``), the reference agent ``gt-agent`` (``gt.agent_start``, ``gt.agent``) and the
scripted model server for tests and demos (``gt.model_server``). They talk to the services only through NATS
(commands, queries, the log); ``shared/`` and ``services/`` never import this package
(tests/unit/test_package_boundaries.py)."""

from shared.bus import nats_import as _nats_import  # noqa: F401  (first: shared.bus.nats_import)
