"""The mayor: beads (and, in later issues, molecules, convoys, mail, escalations and sling dispatch)."""
