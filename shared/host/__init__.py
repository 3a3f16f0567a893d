"""Adapters to the host: git, tmux, processes, users and files an agent can write. Import only
``shared.core`` and ``shared.model``."""
