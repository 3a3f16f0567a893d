"""Service liveness from heartbeats: up, down, stopped, takeover by another instance, escalation. Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.deacon.plan.liveness import Policy, family_down, plan
from services.deacon.projection import fold_liveness as fold
from services.deacon.state import LivenessState
from shared.model.events import Event, ServiceDown, ServiceStopped, ServiceUp, encode_event
from shared.model.heartbeats import ServiceHeartbeat, decode, encode
from shared.service.projection import Projection

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = Policy(stale_after_s=3, startup_grace_s=10, escalate_after_s=60, expected=("mayor", "witness"))


class Watch:
    def __init__(self) -> None:
        self.projection = Projection("liveness", LivenessState, fold, schema_version=1)
        self.seq = 0
        self.now = T0
        self.beats: dict[str, ServiceHeartbeat] = {}

    def beat(
        self, service: str, instance: str = "1-a", *, ago: float = 0.0, stopping: bool = False, standby: bool = False
    ) -> None:
        self.beats[f"{service}.{instance}"] = ServiceHeartbeat(
            service=service,
            instance=instance,
            pid=int(instance.split("-")[0]),
            host="box",
            started_at=T0,
            ts=self.now - timedelta(seconds=ago),
            stopping=stopping,
            standby=standby,
        )

    def step(self) -> list[Event]:
        """Plan, then store and fold what was owed (as the deacon does); the events."""
        owed = plan(self.projection.state, list(self.beats.values()), self.now, T0, POLICY)
        for new in owed.events:
            self.seq += 1
            data = encode_event(new.payload, event_id=f"ev-{self.seq}", ts=self.now, actor="deacon")
            self.projection.apply(self.seq, f"gt.evt.service.{new.payload.aggregate_id()}", data)
        self.escalations = owed.escalations
        return [e.payload for e in owed.events]

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_a_service_is_up_while_it_beats_and_down_once_when_it_stops() -> None:
    w = Watch()
    w.beat("mayor")
    w.beat("witness")
    assert {type(e) for e in w.step()} == {ServiceUp}
    assert w.step() == [], "nothing new while both beat"
    w.tick(5)
    w.beat("mayor")  # the witness's last beat is now 5 s old
    (down,) = w.step()
    assert isinstance(down, ServiceDown)
    assert (down.service, down.reason) == ("witness", "no heartbeat for 5.0 s")
    assert down.last_seen == T0
    assert w.step() == [], "down is recorded once"
    w.beat("witness", "2-b")  # restarted: a new process
    (up,) = w.step()
    assert isinstance(up, ServiceUp)
    assert (up.service, up.instance, up.pid) == ("witness", "2-b", 2)


def test_a_clean_stop_is_recorded_as_stopped_not_down() -> None:
    w = Watch()
    w.beat("mayor")
    w.step()
    w.tick(1)
    w.beat("mayor", stopping=True)
    (stopped,) = w.step()
    assert isinstance(stopped, ServiceStopped)
    w.tick(600)
    assert [e.service for e in w.step() if isinstance(e, ServiceDown)] == ["witness"], "only the one never seen"
    w.tick(600)
    assert w.step() == []
    assert [e.service for e in w.escalations] == ["witness"], "a stopped service is not escalated"


def test_a_standby_beating_beside_the_active_one_changes_nothing_until_the_active_one_dies() -> None:
    w = Watch()
    w.beat("mayor", "1-a")
    w.step()
    w.beat("mayor", "2-b")
    assert w.step() == []
    w.tick(4)
    w.beat("mayor", "2-b")
    (down,) = w.step()
    assert isinstance(down, ServiceDown)
    assert (down.instance, down.reason) == ("1-a", "replaced by 2-b (no heartbeat for 4.0 s)")
    (up,) = w.step()
    assert isinstance(up, ServiceUp)
    assert up.instance == "2-b", "the standby took over"


def witness_events(w: Watch) -> list[Event]:
    return [e for e in w.step() if isinstance(e, ServiceUp | ServiceDown | ServiceStopped) and e.service == "witness"]


def test_a_standby_alone_is_no_service_and_never_makes_the_recorded_one_flap() -> None:
    w = Watch()
    w.beat("witness", "1-a")
    (up,) = witness_events(w)
    assert isinstance(up, ServiceUp)
    for _ in range(3):  # a standby beating beside the active one: nothing, again and again
        w.tick(1)
        w.beat("witness", "1-a")
        w.beat("witness", "2-b", standby=True)
        assert witness_events(w) == []
    w.tick(4)  # the active one died; its standby keeps beating as a standby (it has not taken over yet)
    w.beat("witness", "2-b", standby=True)
    (down,) = witness_events(w)
    assert isinstance(down, ServiceDown)
    assert (down.instance, down.reason) == ("1-a", "no heartbeat for 4.0 s")
    for _ in range(3):
        w.tick(1)
        w.beat("witness", "2-b", standby=True)
        assert witness_events(w) == [], "a standby alone does not make the service up"
    w.beat("witness", "2-b")  # it took over: now it beats as the active one
    (up,) = witness_events(w)
    assert isinstance(up, ServiceUp)
    assert up.instance == "2-b"
    w.tick(1)
    w.beat("witness", "2-b")
    w.beat("witness", "1-a", standby=True)  # the old one is back, as a standby
    assert witness_events(w) == []


def test_a_watched_service_with_only_a_standby_is_down_after_the_grace() -> None:
    w = Watch()
    w.beat("mayor", "1-a", standby=True)
    w.beat("witness", "2-b")
    assert [e.service for e in w.step() if isinstance(e, ServiceUp)] == ["witness"]
    w.tick(11)
    w.beat("mayor", "1-a", standby=True)
    w.beat("witness", "2-b")
    (down,) = w.step()
    assert isinstance(down, ServiceDown)
    assert down.service == "mayor"


def test_witness_scopes_are_down_as_a_family() -> None:
    w = Watch()
    w.beat("witness-east", "1-a")
    w.beat("witness-west", "2-b")
    w.step()
    w.tick(4)
    w.beat("witness-east", "1-a")
    w.step()
    assert family_down(w.projection.state, "witness") == ["witness-west"]
    assert family_down(w.projection.state, "refinery") == []


def test_a_service_that_never_reported_is_down_after_the_grace_and_escalated_once() -> None:
    w = Watch()
    w.beat("mayor")
    w.step()
    w.tick(9)
    w.beat("mayor")
    assert w.step() == [], "within the start-up grace"
    w.tick(1)
    w.beat("mayor")
    (down,) = w.step()
    assert isinstance(down, ServiceDown)
    assert down.service == "witness"
    assert "no heartbeat since the deacon started" in down.reason
    w.tick(59)
    w.beat("mayor")
    w.step()
    assert w.escalations == []
    w.tick(1)
    w.beat("mayor")
    w.step()
    assert [e.service for e in w.escalations] == ["witness"]
    first = w.escalations[0].command_id
    w.tick(30)
    w.beat("mayor")
    w.step()
    assert [e.command_id for e in w.escalations] == [first], "the same command id: stored once"


def test_heartbeats_round_trip_and_junk_is_not_a_heartbeat() -> None:
    beat = ServiceHeartbeat(service="mayor", instance="1-a", pid=1, host="h", started_at=T0, ts=T0, caught_up=True)
    assert decode(encode(beat)) == beat
    assert decode(b"not json") is None
    assert decode(b'{"service": "mayor"}') is None
