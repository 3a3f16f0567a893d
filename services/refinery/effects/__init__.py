"""The refinery's effects: git and the gates (``merger``, blocking, run in a thread, the gates through
``shared.host.gates`` or as jobs on the runners, ``gate_jobs``), the rigs' merge leases (``merge_lease``), a
settlement carried out (``settling``), a session's bundle imported (``bundles``) and the gate runners' service
heartbeats followed (``runner_beats``, for the board)."""
