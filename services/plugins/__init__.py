"""Plugins shipped with gastown-nats, each a process on the plugin SDK (``shared.plugins``):

- ``archiver``: every event into rotating JSONL files that replay to the same projections as the log;
- ``metrics``: a Prometheus exporter of event counts, bead, session and merge queue gauges, and lag.
"""
