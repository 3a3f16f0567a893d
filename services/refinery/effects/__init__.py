"""The refinery's effects: git and the gates (``merger``, blocking, run in a thread), gates as another OS user
(``gate_user``), and what git's refusal of a push means (``refusals``, pure, beside the git it reads)."""
