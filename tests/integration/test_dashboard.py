"""``gt dashboard`` in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): the page
follows a real town live, a convoy's progress moves as its beads merge, a killed agent shows as warranted
and its bead as re-slung, and the page stays right after the dashboard restarts and after NATS restarts.

A screenshot of the page is saved in test-artifacts/ (or $GT_TEST_ARTIFACTS)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from nats.aio.client import Client
from playwright.async_api import Browser, Page, async_playwright

from gt.embedded_nats import EmbeddedServer, free_port
from gt.town_secrets import dashboard_token
from shared.core.config import TownConfig
from shared.model.commands.escalations import EscalationRaise
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually, connected
from tests.witness_town import PolecatTown, polecat_town

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("GT_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts"))


class DashboardProcess:
    """``gt dashboard`` as an operator runs it, on a fixed port so a restart comes back where the page looks."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.env, self.port, self.log = env, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = dashboard_token(Path(env["GT_HOME"]))
        """What the operator finds in the address `gt dashboard` prints (the same file it reads)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def at(self, path: str) -> str:
        """``path`` on the dashboard, with its token, as the printed address carries it."""
        return f"{self.url}{path}{'&' if '?' in path else '?'}token={self.token}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gt.cli.main", "dashboard", "--port", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.at("/api/state"), timeout=5) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result


@pytest.fixture
def server(own_nats_server: EmbeddedServer) -> EmbeddedServer:
    return own_nats_server


@pytest.fixture
async def pt(server: EmbeddedServer, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    town = TownConfig(nats_url=server.url, gt_home=tmp_path / "home")
    async with connected(server.url) as nc, polecat_town(town, nc, tmp_path) as handle:
        yield handle


@pytest.fixture
def dashboard(pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path) -> Iterator[DashboardProcess]:
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home), "GT_PROGRESS": "always"}
    process = DashboardProcess(env, free_port(), tmp_path / "dashboard.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    assert Path(CHROMIUM).exists(), "Chromium is needed (./dev installs Debian's chromium with apt-get)"
    async with async_playwright() as playwright:
        browser: Browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield await browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            await browser.close()


async def text_of(page: Page, selector: str) -> list[str]:
    return [t.strip() for t in await page.locator(selector).all_inner_texts()]


async def wait_for(check: Any, timeout: float = 90) -> Any:
    """Poll an async check until it returns something truthy (a page is not a projection: ask it again)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not seen within {timeout}s (last: {last!r})")
        await asyncio.sleep(0.2)


async def page_is_current(page: Page, nc: Client, config: TownConfig) -> bool:
    """The page shows the log's last sequence and says it is live."""
    last = (await nc.jetstream().stream_info(config.evt_stream)).state.last_seq
    shown = (await text_of(page, "[data-testid=seq]"))[0]
    return shown == str(last) and (await text_of(page, "[data-testid=connection]"))[0] == "live"


async def convoy_progress(page: Page, convoy: str) -> str:
    found = await text_of(page, f"[data-testid=convoy-progress][data-convoy='{convoy}']")
    return found[0] if found else ""


def kill_agent(pt: PolecatTown, bead: str) -> int:
    session = pt.sessions_of(bead)[-1]
    assert session.pane_pid is not None
    pane = psutil.Process(session.pane_pid)
    for proc in [*pane.children(recursive=True), pane]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    return session.attempt


async def test_the_dashboard_follows_the_town_live_through_its_own_restart_and_a_nats_restart(
    pt: PolecatTown, dashboard: DashboardProcess, page: Page, server: EmbeddedServer
) -> None:
    await assert_eventually(dashboard.healthy, timeout=60, message="the dashboard did not start")
    await pt.add_rig("demo", agent_command="GT_AGENT_STEP_PAUSE=0.3 gt-agent", max_polecats=3)
    await pt.add_rig("slow", agent_command="sleep 600", max_polecats=1)
    beads = [await pt.new_bead(f"Convoy bead {i}") for i in (1, 2, 3)]
    convoy = str((await pt.ok("gt.cmd.convoy.create", title="Three in a row", beads=beads))["id"])
    stuck = await pt.new_bead("Worked by an agent that will be killed")
    await page.goto(dashboard.at("/"))
    assert await wait_for(lambda: convoy_progress(page, convoy)) == "0/3"

    # A convoy's progress changes as its beads are worked and merged.
    for bead in beads:
        await pt.sling(bead, rig="demo", no_convoy=True)
    seen: list[str] = []

    async def all_merged() -> bool:
        shown = await convoy_progress(page, convoy)
        if not seen or seen[-1] != shown:
            seen.append(shown)
        return shown == "3/3"

    await wait_for(all_merged, timeout=240)
    assert seen[0] == "0/3"
    assert len(seen) >= 2, seen

    # A killed agent shows as warranted, then its bead is re-slung to a fresh session.
    await pt.sling(stuck, rig="slow", no_convoy=True)
    await wait_for(lambda: text_of(page, f"[data-testid=session-state][data-bead='{stuck}']"))
    await assert_eventually(lambda: pt.sessions_of(stuck)[-1].status == "started", timeout=60)
    killed_attempt = kill_agent(pt, stuck)

    async def warranted_and_reslung() -> bool:
        ended = await text_of(page, f"[data-testid=ended-session][data-bead='{stuck}']")
        active = await page.locator(f"[data-testid=session-state][data-bead='{stuck}']").all()
        sessions = [await a.get_attribute("data-session") for a in active]
        return any(t.startswith("warranted") for t in ended) and any(
            s is not None and not s.endswith(f"-{killed_attempt}") for s in sessions
        )

    await wait_for(warranted_and_reslung, timeout=120)
    feed_types = [await e.get_attribute("data-type") for e in await page.locator("[data-testid=event]").all()]
    assert "session.warranted" in feed_types

    # The feed filter and the bead timeline.
    await page.fill("[data-testid=filter-type]", "session.warranted")
    assert set(await page.locator("[data-testid=event]").evaluate_all("es => es.map(e => e.dataset.type)")) == {
        "session.warranted"
    }
    await page.fill("[data-testid=filter-type]", "")
    await page.fill("[data-testid=timeline-input]", stuck)
    await page.press("[data-testid=timeline-input]", "Enter")
    timeline = await wait_for(lambda: text_of(page, "[data-testid=timeline-event]"))
    assert any("WARRANTED" in line for line in timeline), timeline
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    # The dashboard restarts: the open page reconnects by itself and shows what happened meanwhile.
    dashboard.kill()
    await wait_for(lambda: shows(page, "[data-testid=connection]", "reconnecting…"), timeout=30)
    late = await pt.new_bead("Filed while the dashboard was down")
    later = str((await pt.ok("gt.cmd.convoy.create", title="While it was down", beads=[late]))["id"])
    dashboard.start()
    assert await wait_for(lambda: convoy_progress(page, later), timeout=60) == "0/1"
    await pt.ok("gt.cmd.bead.close", id=late, reason="done by hand")
    assert await wait_for(lambda: _progress_is(page, later, "1/1"), timeout=60)
    await wait_for(lambda: page_is_current(page, pt.nc, pt.config), timeout=60)

    # NATS restarts: the dashboard resubscribes where it was and the page goes on.
    await asyncio.to_thread(server.restart)
    again = await pt.new_bead("Filed after NATS came back")
    after = str((await pt.ok("gt.cmd.convoy.create", title="After the restart", beads=[again]))["id"])
    await pt.ok("gt.cmd.bead.close", id=again, reason="done by hand")
    assert await wait_for(lambda: _progress_is(page, after, "1/1"), timeout=90)
    await wait_for(lambda: page_is_current(page, pt.nc, pt.config), timeout=60)
    assert await convoy_progress(page, convoy) == "3/3", "nothing shown before is lost"
    api = dashboard.state()
    assert {c["id"]: f"{c['closed']}/{c['total']}" for c in api["convoys"]}[convoy] == "3/3"
    await page.screenshot(path=str(ARTIFACTS / "dashboard-after-restarts.png"), full_page=True)


async def shows(page: Page, selector: str, text: str) -> bool:
    return text in await text_of(page, selector)


async def _progress_is(page: Page, convoy: str, expected: str) -> bool:
    return await convoy_progress(page, convoy) == expected


async def test_the_dashboard_answers_bad_requests_clearly(pt: PolecatTown, dashboard: DashboardProcess) -> None:
    await assert_eventually(dashboard.healthy, timeout=60)

    def status_of(path: str, method: str = "GET", token: bool = True) -> tuple[int, bytes]:
        request = urllib.request.Request(dashboard.at(path) if token else f"{dashboard.url}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    assert (await asyncio.to_thread(status_of, "/nowhere"))[0] == 404
    assert (await asyncio.to_thread(status_of, "/", "POST"))[0] == 405
    code, body = await asyncio.to_thread(status_of, "/api/bead/gt-nosuch")
    assert code == 404
    assert b"no events for bead gt-nosuch" in body
    code, body = await asyncio.to_thread(status_of, "/")
    assert code == 200
    assert b"EventSource" in body
    # Without the token (an agent on the same machine): nothing of the town, only whether it is up.
    for path in ("/", "/api/state", "/events", "/api/bead/gt-nosuch", "/nowhere", "/?token=wrong"):
        code, body = await asyncio.to_thread(status_of, path, "GET", False)
        assert code == 401, (path, code)
        assert b"convoys" not in body
        assert b"EventSource" not in body
    assert (await asyncio.to_thread(status_of, "/healthz", "GET", False))[0] == 200
    # On start it showed its replay of the log as a progress bar, then where to find it.
    said = dashboard.log.read_text()
    assert "replaying the log [" in said
    assert f"dashboard: http://127.0.0.1:{dashboard.port}/?token={dashboard.token} " in said


PANE_TAIL = "\n".join(
    [
        "╭" + "─" * 198 + "╮",
        "│ > Run the project's tests and fix what fails" + " " * 150 + "│",
        "╰" + "─" * 198 + "╯",
        "  ⏵⏵ accept edits on (shift+tab to cycle)",
    ]
)


async def page_fits(page: Page) -> dict[str, Any]:
    """How wide the document is against the window, and every id on the page that takes more than one line."""
    result: dict[str, Any] = await page.evaluate(
        """() => ({
            scroll: document.documentElement.scrollWidth,
            inner: window.innerWidth,
            broken: [...document.querySelectorAll(".id, a.bead")]
                .filter((e) => e.getClientRects().length !== 1).map((e) => e.textContent),
            ids: document.querySelectorAll("[data-testid=convoy-id]").length,
        })"""
    )
    return result


async def test_long_text_neither_widens_the_page_nor_breaks_an_id_and_old_closed_convoys_are_counted(
    pt: PolecatTown, dashboard: DashboardProcess, page: Page
) -> None:
    await assert_eventually(dashboard.healthy, timeout=60, message="the dashboard did not start")
    unbroken = "pane:" + "─" * 200
    await pt.send(EscalationRaise(severity="high", message=unbroken))
    await pt.send(EscalationRaise(severity="medium", message=f"the agent's pane ends:\n{PANE_TAIL}"))
    long_title = " ".join(["a title that says far too much about what the work is"] * 9)
    bead = await pt.new_bead(long_title)
    still_open = [
        str((await pt.ok("gt.cmd.convoy.create", title="x" * 200, beads=[bead]))["id"]),
        str((await pt.ok("gt.cmd.convoy.create", title=long_title, beads=[await pt.new_bead("y" * 200)]))["id"]),
    ]
    # Eight convoys closed, one after the other: the page lists the last five and counts the others.
    closed = []
    for n in range(8):
        done = await pt.new_bead(f"Done {n}")
        closed.append(str((await pt.ok("gt.cmd.convoy.create", title=f"Closed {n}", beads=[done]))["id"]))
        await pt.ok("gt.cmd.bead.close", id=done, reason="done by hand")
        await assert_eventually(
            lambda: any(c["id"] == closed[-1] and c["status"] == "closed" for c in dashboard.state()["convoys"])
        )
    await page.goto(dashboard.at("/"))
    await wait_for(
        lambda: shows(page, "[data-testid=older-closed-convoys]", "and 3 closed before (gt convoy list --all)")
    )
    await wait_for(lambda: text_of(page, "[data-testid=escalation-message]"))
    shown = await text_of(page, "[data-testid=convoy-id]")
    assert shown == sorted(still_open) + closed[:2:-1], "the open ones, then the five last closed, newest first"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (1400, 800):
        await page.set_viewport_size({"width": width, "height": 1000})
        fits = await page_fits(page)
        assert fits["inner"] == width
        assert fits["scroll"] <= fits["inner"], fits
        assert fits["ids"] == 7, fits
        assert fits["broken"] == [], fits
        await page.screenshot(path=str(ARTIFACTS / f"dashboard-long-text-{width}.png"), full_page=True)

    # A long message shows its first lines; a click shows all of it, still within the page.
    message = page.locator("[data-testid=escalation-message]", has_text="the agent's pane ends")
    assert await message.evaluate("e => e.scrollHeight > e.clientHeight + 1"), "cut to its first lines"
    await message.click()
    assert await message.evaluate("e => e.scrollHeight <= e.clientHeight + 1"), "all of it"
    assert (await message.inner_text()).strip() == f"the agent's pane ends:\n{PANE_TAIL}".strip()
    fits = await page_fits(page)
    assert fits["scroll"] <= fits["inner"], fits
    # It stays open when the page redraws (the town moves on).
    await pt.new_bead("Something new")
    await wait_for(lambda: page_is_current(page, pt.nc, pt.config), timeout=60)
    assert await message.evaluate("e => e.classList.contains('open')")
