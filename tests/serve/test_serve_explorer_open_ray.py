"""The memory explorer for a first-time visitor, in headless Chromium against `memlib serve
--open-local` started as a user starts it (a subprocess, over a store built by `memlib build`): the
page connects with no token, explains every signal chip of a hit, and draws the derived graph with
no edge label until a node is pointed at or clicked. Screenshots go to the test's directory
(MEMLIB_SCREENSHOTS=DIR copies the graph view there, for docs/explorer-graph.png)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobs.local_ray import free_port
from tests.serve.browser import chromium_page
from tests.serve.test_serve_explorer_ray import QUESTION

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def open_url(full_store, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("open_local") / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "serve", "--store", str(full_store), "--open-local",
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while "memory explorer: " not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None and f"memory explorer: {url}/ui/" in log.read_text(), log.read_text()[-3000:]
        yield url, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_open_local_needs_no_token_and_says_so(open_url):
    url, log = open_url
    assert httpx.get(f"{url}/v1/tenants").json()["tenants"] == ["elena", "maya", "raj", "tomas-lena"]
    text = log.read_text()
    assert "open-local: no tokens; only this machine can connect (127.0.0.1)" in text
    for noise in ("will not be applied", "core_worker", "\tINFO "):  # Serve's and Ray's start lines: hidden
        assert noise not in text, text


def test_the_page_connects_explains_signals_and_labels_edges_on_hover(open_url, tmp_path):
    url, _ = open_url
    with chromium_page() as (page, refused):
        page.goto(f"{url}/ui/")
        page.wait_for_selector("#ask:not([hidden])", timeout=60_000)  # no token typed
        assert page.is_hidden("#welcome") and "open (no token needed)" in page.inner_text("#status")
        page.select_option("#tenant", "maya")
        page.fill("#question", QUESTION)
        page.click("#search")
        page.wait_for_selector("#signals-legend:not([hidden]) dt", timeout=60_000)
        legend = dict(zip(page.eval_on_selector_all("#signals-legend dt", "ds => ds.map(d => d.textContent)"),
                          page.eval_on_selector_all("#signals-legend dd", "ds => ds.map(d => d.textContent)")))
        for signal_name in ("z_maxsim", "session_prior", "named_participant"):
            assert len(legend.get(signal_name, "")) > 20, legend
        chip = page.get_attribute("#results li.hit .chip[data-signal=z_maxsim]", "title")
        assert chip == legend["z_maxsim"]
        page.click("#results li.hit >> nth=0")
        page.wait_for_selector("#graph svg circle", timeout=60_000)
        visible = "els => els.filter(e => getComputedStyle(e).display !== 'none').map(e => e.dataset.edge)"
        assert page.locator("#graph text.edge-label").count() >= 2
        assert page.eval_on_selector_all("#graph text.edge-label", visible) == []  # at rest: no edge label
        nodes = page.eval_on_selector_all("#graph g.node", "gs => gs.map(g => g.dataset.id)")
        edges = page.eval_on_selector_all("#graph line.edge", "ls => ls.map(l => [l.dataset.src, l.dataset.dst])")
        busiest = max(nodes[1:], key=lambda n: sum(n in e for e in edges))
        mine = {str(i) for i, e in enumerate(edges) if busiest in e}
        page.hover(f"#graph g.node[data-id='{busiest}'] circle")
        assert set(page.eval_on_selector_all("#graph text.edge-label", visible)) == mine  # its edges only
        page.mouse.move(5, 5)
        assert page.eval_on_selector_all("#graph text.edge-label", visible) == []
        page.click(f"#graph g.node[data-id='{busiest}'] circle")  # a click keeps them
        page.mouse.move(5, 5)
        assert set(page.eval_on_selector_all("#graph text.edge-label", visible)) == mine
        shot = tmp_path / "explorer-graph.png"
        page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("MEMLIB_SCREENSHOTS"):
            shutil.copy(shot, Path(os.environ["MEMLIB_SCREENSHOTS"]))
        assert not refused, refused
