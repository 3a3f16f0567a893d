"""The only package that talks to NATS (docs/architecture.md, "Where things are"): its ports take a ``Connection``
and answer with typed errors and plain values."""
