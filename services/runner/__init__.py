"""The gate runner (``gt-runner``): runs the gates of the refinery's merge queue as durable jobs.

The refinery pushes each candidate commit to the rig's repository (``refs/gt/gate/<job>``) and asks for its gates
in the log (``gate.requested``). Every runner follows the log (``projection``); an idle one takes the oldest job
nobody runs, or one whose runner went quiet (``plan``), by writing ``gate.started`` against the job's last event
(of two runners only one gets it), fetches the candidate into its own clone of the rig and runs the gates in its
persistent workspace (``effects.job_run``, through ``shared.host.gates``), with a heartbeat in the log while they run,
then writes the result. A runner that loses its job (the refinery cancelled it, or it went quiet and another took
it) stops the gate and writes nothing more. Several run at once, on this host or others: each has its own name
(``GT_RUNNER_NAME``) and is its own service scope (``runner-<name>``).
"""
