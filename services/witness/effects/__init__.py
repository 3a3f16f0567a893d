"""The witness's effects: everything it does to the world (tmux, git, processes, files, the agents' transcripts),
carried out from the plan's actions, each step recorded as an event."""
