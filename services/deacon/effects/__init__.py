"""The deacon's effects: its watch, one pass per tick (``housekeeping``), over the KV watches of heartbeats and
lease renewals (``supervision``), the KV sweep after a ``gc.swept`` (``gc_kv``), the disk and JetStream storage
measurements (``disk_watch``); and the stream scans of event gates with a subject filter (``event_scan``)."""
