"""The only package that talks to NATS. Everything above it sees typed errors and plain values."""
