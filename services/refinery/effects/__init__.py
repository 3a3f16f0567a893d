"""The refinery's effects: git and the gates (``merger``, blocking, run in a thread; ``gate_runs``,
``gate_watch``, ``gate_user``), the rigs' merge leases (``merge_lease``), a settlement carried out
(``settling``) and a session's bundle imported (``bundles``)."""
