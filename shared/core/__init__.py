"""The bottom layer: errors, configuration, logging, ids, subjects and small helpers every other layer
uses. Imports nothing of ``shared`` outside ``shared.core``."""
