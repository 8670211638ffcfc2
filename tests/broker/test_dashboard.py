"""The status page's dashboard: rendered by a real headless Chromium, with a
screenshot kept as a test artifact; the text summary and the sample history."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from lockmq.broker.dashboard import MAX_KNOWN_LOCKS, History, Sample, sparkline
from lockmq.protocol import Role

from lockmq.testing import Peer, open_peer, wait_for

#: where the screenshot is kept after the run (ignored by git)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def get(url: str, accept: str = "") -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def chromium(tmp_path: Path, *args: str) -> str:
    """Run headless Chromium with a profile of its own; its stdout."""
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", f"--user-data-dir={tmp_path / 'chromium-profile'}",
           "--window-size=1200,800", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def busy_broker(broker) -> tuple[str, Peer, Peer]:
    """A broker with two locks seen (one gone), a lagging cluster and three samples."""
    url = broker.status_page()
    online, gone = open_peer(broker.port, sn="LOCK-1", role=Role.LOCK), \
        open_peer(broker.port, sn="LOCK-2", role=Role.LOCK)
    member = open_peer(broker.port)
    sub = member.subscribe("ev", "backend").sub_id
    for seq in range(20):
        online.publish("ev", seq)
    broker.call(broker.broker.status.sample)
    got = member.pull(sub, 5).messages
    member.ack(sub, [m.lease for m in got])
    gone.publish("ev", 0)
    broker.call(broker.broker.status.sample)
    gone.close()
    wait_for(lambda: broker.call(lambda: len(broker.broker.admin.devices({})["devices"])) == 1,
             "LOCK-2 to go offline")
    for seq in range(20, 50):
        online.publish("ev", seq)
    broker.call(broker.broker.status.sample)
    return url, online, member


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`; "
                    "scripts/system-deps.sh installs it)")
def test_dashboard_renders_in_headless_chromium(broker, tmp_path):
    url, online, member = busy_broker(broker)

    dom = chromium(tmp_path, "--dump-dom", url + "/")
    assert "Locks online" in dom and "Publish rate" in dom and "Dead letters" in dom
    assert '<ul id="offline"><li>LOCK-2' in dom
    row = dom[dom.index("<td>backend</td>"):]
    row = row[:row.index("</tr>")]
    assert "<td>live</td>" in row and '<td class="n">46</td>' in row   # 51 - 5 acked
    assert row.count("<polyline") == 1                                  # lag sparkline

    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", url + "/")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / "dashboard.png"
    shutil.copyfile(shot, kept)
    print(f"dashboard screenshot: {kept}")
    assert online is not None and member is not None


def test_text_summary_history_and_content_types(broker):
    url, online, member = busy_broker(broker)
    ctype, page = get(url + "/")
    assert ctype.startswith("text/html") and page.startswith("<!doctype html>")
    ctype, text = get(url + "/", accept="text/plain")
    assert ctype.startswith("text/plain") and "locks online 1" in text
    # the same page (its uptime may have ticked a second between the two requests)
    def same(page: str) -> str:
        return re.sub(r"uptime \d+ s", "uptime N s", page)
    assert same(get(url + "/summary")[1]) == same(text)
    ctype, body = get(url + "/history")
    hist = json.loads(body)
    assert ctype == "application/json" and hist["every_s"] == 10
    last = hist["samples"][-1]
    assert last["published"] == 51 and last["backlog"] == {"backend": 46}
    assert last["locks_online"] == 1
    assert online is not None and member is not None


def _sample(t: float) -> Sample:
    return Sample(t=t, published=int(t) * 10, delivered=0, dead_letters=0, locks_online=0,
                  connections=0, log_bytes=0, disk_free=0.0)


def test_history_is_a_bounded_ring_and_rates_come_from_consecutive_samples():
    h = History(every_s=10, span_s=60)
    for t in range(20):
        h.add(_sample(10.0 * t), [])
    assert len(h.samples) == 6 and h.samples[0].t == 140.0
    assert h.rates(lambda s: s.published) == [10.0] * 5
    h.add(_sample(200.0), (f"LOCK-{i}" for i in range(MAX_KNOWN_LOCKS + 5)))
    assert len(h.last_seen) == MAX_KNOWN_LOCKS
    assert [sn for sn, _ in h.offline({"LOCK-1"})][:2] == ["LOCK-0", "LOCK-2"]


def test_sparkline_scales_into_its_box():
    assert "<polyline" not in sparkline([5.0])
    svg = sparkline([0.0, 5.0, 10.0], width=100, height=20)
    assert 'points="0.0,18.0 50.0,10.0 100.0,2.0"' in svg
