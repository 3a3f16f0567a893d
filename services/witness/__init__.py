"""The witness service: rigs, polecat sessions, nudges."""
