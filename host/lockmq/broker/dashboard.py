"""The status page's dashboard: one self-contained HTML page, no JavaScript.

:class:`History` keeps a bounded ring of samples (one every
:data:`SAMPLE_EVERY_S` seconds for :data:`HISTORY_S`, taken by the broker's
periodic helper) so the page can show the last hour: publish and deliver rates,
each cluster's lag, disk use. :func:`render` draws the page on the server with
inline SVG sparklines; the page reloads itself every sample interval. Nothing is
fetched from elsewhere (a gateway in a closet has no internet).
"""

from __future__ import annotations

import html
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

#: seconds between two samples, and how far back the page looks
SAMPLE_EVERY_S = 10.0
HISTORY_S = 3600.0
#: lock SNs remembered to show who went offline (bounds memory against SN floods)
MAX_KNOWN_LOCKS = 10_000
#: offline locks listed by name on the page
MAX_LISTED_OFFLINE = 20


@dataclass
class Sample:
    """The broker at one moment (counters are totals since start)."""

    t: float
    published: int
    delivered: int
    dead_letters: int
    locks_online: int
    connections: int
    log_bytes: int
    disk_free: float
    #: cluster name -> backlog (lag), live and offline clusters alike
    backlog: dict[str, int] = field(default_factory=dict)


def take_sample(stats: dict[str, Any], clusters: list[dict[str, Any]],
                disk_free: float, now: float | None = None) -> Sample:
    """A :class:`Sample` from the ``stats`` and ``clusters`` admin views."""
    backlog: dict[str, int] = {}
    for c in clusters:
        backlog[c["name"]] = backlog.get(c["name"], 0) + int(c["backlog"])
    counters = stats["broker"]
    return Sample(t=time.time() if now is None else now,
                  published=counters.get("publish_stored", 0),
                  delivered=counters.get("messages_delivered", 0),
                  dead_letters=sum(int(c.get("dlq_size", 0)) for c in clusters),
                  locks_online=stats["devices_online"], connections=stats["connections"],
                  log_bytes=stats["log_bytes"], disk_free=disk_free, backlog=backlog)


class History:
    """The last :data:`HISTORY_S` seconds of samples, and the locks seen online."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S, span_s: float = HISTORY_S) -> None:
        self.every_s = every_s
        self.samples: deque[Sample] = deque(maxlen=max(2, int(span_s / every_s)))
        #: SN -> wall time it was last seen online (at most MAX_KNOWN_LOCKS)
        self.last_seen: dict[str, float] = {}

    def add(self, sample: Sample, online: Iterable[str]) -> None:
        """Append ``sample``; remember the SNs online now."""
        self.samples.append(sample)
        for sn in online:
            if sn in self.last_seen or len(self.last_seen) < MAX_KNOWN_LOCKS:
                self.last_seen[sn] = sample.t

    def offline(self, online: set[str]) -> list[tuple[str, float]]:
        """Locks seen online since the broker started that are not online now,
        longest gone first: ``(sn, last seen)``."""
        gone = [(sn, t) for sn, t in self.last_seen.items() if sn not in online]
        return sorted(gone, key=lambda x: x[1])

    def series(self, value: Callable[[Sample], float]) -> list[float]:
        """``value`` of every sample, oldest first."""
        return [value(s) for s in self.samples]

    def rates(self, value: Callable[[Sample], float]) -> list[float]:
        """Per-second rate of a counter between consecutive samples."""
        s = list(self.samples)
        return [max(0.0, (value(b) - value(a)) / (b.t - a.t)) if b.t > a.t else 0.0
                for a, b in zip(s, s[1:])]

    def to_json(self) -> dict[str, Any]:
        """The ring as JSON (``GET /history``)."""
        return {"every_s": self.every_s, "samples": [asdict(s) for s in self.samples]}


def sparkline(values: list[float], width: int = 220, height: int = 36) -> str:
    """An inline SVG polyline of ``values`` scaled to the box (empty box if < 2)."""
    box = (f'<svg class="spark" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img">')
    if len(values) < 2:
        return box + "</svg>"
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    pts = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}"
                   for i, v in enumerate(values))
    return box + f'<polyline points="{pts}" /></svg>'


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _rate_text(rates: list[float]) -> str:
    return f"{rates[-1]:.1f}/s" if rates else "&ndash;"


def _tile(title: str, value: str, detail: str = "", spark: str = "", alert: bool = False) -> str:
    cls = "tile alert" if alert else "tile"
    return (f'<div class="{cls}"><h2>{title}</h2><div class="big">{value}</div>'
            f'<div class="detail">{detail}</div>{spark}</div>')


STYLE = """
body{font:14px system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px}
header h1{font-size:18px;margin:0}
header span{opacity:.7;margin-left:12px}
main{padding:16px 20px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:12px}
.tile{background:#fff;border-radius:6px;padding:12px 14px;box-shadow:0 1px 2px #0002}
.tile.alert{border-left:5px solid #c62828}
.tile h2{font-size:12px;text-transform:uppercase;letter-spacing:.05em;margin:0;color:#667}
.big{font-size:28px;font-weight:600;margin:4px 0}
.detail{color:#667;min-height:1.2em}
.spark polyline{fill:none;stroke:#1e6fd9;stroke-width:1.5}
table{border-collapse:collapse;background:#fff;margin-top:16px;width:100%;
 box-shadow:0 1px 2px #0002}
th,td{padding:6px 10px;text-align:left;border-bottom:1px solid #e3e5ea}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.lag td{background:#fff4f4}
footer{padding:10px 20px;color:#667}
"""


def render(title: str, stats: dict[str, Any], clusters: list[dict[str, Any]],
           online: set[str], history: History) -> str:
    """The dashboard page for the current views and the sampled history."""
    h = history
    b = stats["broker"]
    offline = h.offline(online)
    pub, dlv = h.rates(lambda s: s.published), h.rates(lambda s: s.delivered)
    dead = sum(int(c.get("dlq_size", 0)) for c in clusters)
    last = h.samples[-1] if h.samples else None
    free = last.disk_free if last else 0.0
    tiles = [
        _tile("Locks online", str(len(online)),
              f"{len(offline)} offline (seen since start)",
              sparkline(h.series(lambda s: s.locks_online)), alert=bool(offline)),
        _tile("Publish rate", _rate_text(pub), f"{b.get('publish_stored', 0)} stored",
              sparkline(pub)),
        _tile("Deliver rate", _rate_text(dlv), f"{b.get('messages_delivered', 0)} delivered",
              sparkline(dlv)),
        _tile("Dead letters", str(dead), "in $dlq topics", alert=dead > 0),
        _tile("Disk", human_bytes(stats["log_bytes"]),
              f"commit log; {human_bytes(free)} free", sparkline(h.series(lambda s: s.log_bytes))),
        _tile("Connections", str(stats["connections"]), f"max {stats['max_connections']}",
              sparkline(h.series(lambda s: s.connections))),
    ]
    rows = []
    for c in clusters:
        name = c["name"]
        lag = h.series(lambda s, n=name: s.backlog.get(n, 0))
        live = c.get("live", True)
        cls = ' class="lag"' if c["backlog"] else ""
        rows.append(
            f"<tr{cls}><td>{html.escape(name)}</td><td>{html.escape(c['topic'])}</td>"
            f"<td>{'live' if live else 'offline'}</td>"
            f'<td class="n">{len(c.get("members", ()))}</td>'
            f'<td class="n">{c.get("inflight", 0)}</td><td class="n">{c["backlog"]}</td>'
            f"<td>{sparkline(lag, 160, 24)}</td>"
            f'<td class="n">{c.get("dlq_size", 0)}</td></tr>')
    gone = "".join(f"<li>{html.escape(sn)} &middot; last seen "
                   f"{time.strftime('%H:%M:%S', time.localtime(t))}</li>"
                   for sn, t in offline[:MAX_LISTED_OFFLINE])
    more = len(offline) - MAX_LISTED_OFFLINE
    refresh = max(1, int(h.every_s))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body><header><h1>{html.escape(title)}<span>up {b.get('uptime_s', 0):.0f} s</span></h1></header>
<main><div class="tiles">{''.join(tiles)}</div>
<table><thead><tr><th>cluster</th><th>topic</th><th>state</th><th>members</th>
<th>in flight</th><th>backlog</th><th>lag, last hour</th><th>dead letters</th></tr></thead>
<tbody>{''.join(rows) or '<tr><td colspan="8">no consumer clusters</td></tr>'}</tbody></table>
{f'<h3>Offline locks</h3><ul id="offline">{gone}</ul>' if gone else ''}
{f'<p>and {more} more</p>' if more > 0 else ''}
</main><footer>{len(h.samples)} samples every {h.every_s:g} s &middot;
<a href="/summary">text summary</a> &middot; <a href="/metrics">/metrics</a> &middot;
<a href="/stats">/stats</a> &middot; <a href="/clusters">/clusters</a> &middot;
<a href="/history">/history</a></footer></body></html>
"""
