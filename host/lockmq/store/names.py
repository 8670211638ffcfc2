"""Every file name in a data directory, in one place (layout: FORMAT.md).

::

    <data_dir>/LOCK                      flock: one process at a time
    <data_dir>/checkpoint                where recovery may start
    <data_dir>/damage                    quarantined damaged log ranges (damage.py)
    <data_dir>/clock                     the broker's steady time (lockmq.clock)
    <data_dir>/offset-<topic>.log        one index per topic
    <data_dir>/consume-<cluster>.log     one positions file per consumer cluster
    <data_dir>/positions.copy            a second copy of every cluster's positions
    <data_dir>/reindex                   topics whose index a read found beyond repair
    <data_dir>/log_start                 where retention left the log's start
    <data_dir>/message.log/<base:020d>.log     a commit-log segment
    <data_dir>/message.log/<base:020d>.qstart  its queue-start sidecar
    *.tmp                                half-written atomic replacements

Each name has a builder and a parser (``None`` for a name that is not one), so no
other module slices file names by hand. Pure functions plus ``os.listdir``; also
imported by ``lockmq.spark`` on Spark executors, so it stays free of heavy imports.
"""

from __future__ import annotations

import os

SEGMENT_DIR = "message.log"
SEGMENT_SUFFIX = ".log"
QSTART_SUFFIX = ".qstart"
CHECKPOINT = "checkpoint"
DAMAGE = "damage"
POSITIONS_COPY = "positions.copy"
REINDEX = "reindex"
LOG_START = "log_start"
CLOCK = "clock"
LOCK = "LOCK"
TMP_SUFFIX = ".tmp"
_BASE_DIGITS = 20
_INDEX_PREFIX = "offset-"
_POSITIONS_PREFIX = "consume-"
_DATA_SUFFIX = ".log"


def segment_name(base: int) -> str:
    """File name of the segment starting at commit-log offset ``base``."""
    return f"{base:0{_BASE_DIGITS}d}{SEGMENT_SUFFIX}"


def qstart_name(base: int) -> str:
    """File name of the queue-start sidecar of the segment at ``base``."""
    return f"{base:0{_BASE_DIGITS}d}{QSTART_SUFFIX}"


def segment_base(name: str) -> int | None:
    """Base offset named by a segment file name, or None if ``name`` is not one."""
    stem, ext = os.path.splitext(name)
    if ext == SEGMENT_SUFFIX and len(stem) == _BASE_DIGITS and stem.isdigit():
        return int(stem)
    return None


def list_segments(seg_dir: str) -> list[int]:
    """Sorted base offsets of the segment files in ``seg_dir``."""
    bases = [b for b in map(segment_base, os.listdir(seg_dir)) if b is not None]
    bases.sort()
    return bases


def _between(name: str, prefix: str) -> str | None:
    if name.startswith(prefix) and name.endswith(_DATA_SUFFIX) and \
            len(name) > len(prefix) + len(_DATA_SUFFIX):
        return name[len(prefix):-len(_DATA_SUFFIX)]
    return None


def index_file_name(topic: str) -> str:
    """File name of a topic's index inside the data directory."""
    return f"{_INDEX_PREFIX}{topic}{_DATA_SUFFIX}"


def index_topic(name: str) -> str | None:
    """Topic whose index file is called ``name``, or None if it is not an index."""
    return _between(name, _INDEX_PREFIX)


def positions_file_name(cluster: str) -> str:
    """File name of a consumer cluster's positions inside the data directory."""
    return f"{_POSITIONS_PREFIX}{cluster}{_DATA_SUFFIX}"


def positions_cluster(name: str) -> str | None:
    """Cluster whose positions file is called ``name``, or None if it is not one."""
    return _between(name, _POSITIONS_PREFIX)


def index_files(data_dir: str) -> dict[str, str]:
    """``{topic: file name}`` of every index file in ``data_dir``, sorted by topic."""
    found = ((index_topic(name), name) for name in os.listdir(data_dir))
    return dict(sorted((k, name) for k, name in found if k is not None))


def positions_files(data_dir: str) -> dict[str, str]:
    """``{cluster: file name}`` of every positions file in ``data_dir``, sorted by cluster."""
    found = ((positions_cluster(name), name) for name in os.listdir(data_dir))
    return dict(sorted((k, name) for k, name in found if k is not None))
