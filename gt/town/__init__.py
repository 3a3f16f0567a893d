"""The laptop town: ``gt up`` and ``gt down``, an embedded NATS server plus the services, supervised as child
processes.

The supervisor writes ``$GT_HOME/run/town.json``: its own identity, the NATS URL, each child's identity
(pid and start time), and whether the town is ready. ``gt down`` signals the supervisor, which stops the
services in reverse dependency order, then NATS. A service that dies is restarted with exponential
backoff; one that keeps dying (more than 5 restarts within 15 minutes) is left down and escalated. The
embedded nats-server is supervised the same way: restarted on its port with its store, and left down (and
escalated once a NATS answers again) when it keeps dying.

A crash loop's escalation is written to ``$GT_HOME/run/escalations/`` first and sent from there, so one raised
while NATS is unreachable (the embedded server's own crash loop) reaches the mayor once a town's NATS answers,
from this supervisor or the next ``gt up``'s.

If a supervisor was killed outright, its children keep running; the next ``gt up`` finds them through
``town.json`` and stops them (after checking each is still the very process recorded) before it starts.
"""
