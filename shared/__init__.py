"""Code every service and client shares: the model (commands, events, queries), the bus (NATS), the host
(processes, git, tmux) and the service frame. Imports nats-py first, without its WebSocket transport
(``shared.bus.nats_import`` says why)."""

from shared.bus import nats_import as _nats_import  # noqa: F401  (first: before any module of ours imports nats)
