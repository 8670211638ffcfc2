"""The benchmarks' /proc readers (bench/machine.py) read a process's CPU whatever its
command name holds: ``/proc/PID/stat`` has one parser, which splits after the last
')' of the name, so a name with spaces and parentheses moves no field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockmq.testing import proc_status_kib, wait_for

from .helpers import bench_module

machine = bench_module("machine")


def test_cpu_of_a_process_with_parentheses_in_its_name_and_of_its_parent_tree(tmp_path: Path):
    # the kernel's command name is the executable's file name: a link named like this
    odd = tmp_path / "spin) (x y"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "while True: pass"])
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        wait_for(lambda: "(spin) (x y)" in stat.read_text(), "the child runs under its name")
        cpu = wait_for(lambda: (machine.proc_cpu_s(child.pid) or 0) >= 0.05 and
                       machine.proc_cpu_s(child.pid), "the child spent CPU")
        # the child is a live descendant of this process: its CPU is in our tree's
        # (found through its parent pid, the field right after the name)
        user, system = machine.proc_tree_cpu(os.getpid())
        assert user + system >= cpu
    finally:
        child.kill()
        child.wait(10)


def test_memory_lines_of_proc_status_read_in_kib_by_the_harness_and_in_mib_by_bench():
    # a child we hold (alive, not reaped) and one that is gone
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    status = Path(f"/proc/{child.pid}/status")

    def readings_agree() -> bool:
        """The file's VmHWM line, the harness's KiB and bench's MiB, read in turn, say the
        same (until the child idles on stdin its peak may grow between two reads)."""
        line = next((x for x in status.read_text().splitlines() if x.startswith("VmHWM:")), "")
        kib = proc_status_kib(child.pid, "VmHWM")
        mib = machine.proc_status_mb(child.pid, "VmHWM")
        return kib is not None and line.split()[1:] == [str(kib), "kB"] and mib == kib / 1024

    try:
        wait_for(readings_agree, "the three readings of the child's VmHWM agree")
        assert proc_status_kib(child.pid, "NoSuchLine") is None
        assert machine.proc_status_mb(child.pid, "NoSuchLine") is None
    finally:
        child.communicate(b"", timeout=10)
    assert proc_status_kib(child.pid) is None and machine.proc_status_mb(child.pid) is None


def test_a_full_accept_queue_shows_in_the_storm_counters():
    # a listener that never accepts, with room for one queued connection: the kernel
    # drops the handshakes beyond it and counts them (what a storm's p99 is read by)
    import socket

    before = machine.tcp_ext_counters()
    if before is None:
        pytest.skip("no /proc/net/netstat here (not Linux)")
    listener = socket.socket()
    clients = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(listener.getsockname())
            clients.append(c)
        after = wait_for(lambda: (lambda now: now if now["ListenOverflows"] >
                                  before["ListenOverflows"] else None)(
                             machine.tcp_ext_counters()),
                         "the kernel to count a dropped handshake")
        assert set(after) == set(machine.TCP_STORM_COUNTERS)
        # (Linux counts every overflow as a drop too)
        assert after["ListenDrops"] - before["ListenDrops"] >= \
            after["ListenOverflows"] - before["ListenOverflows"]
    finally:
        for c in clients:
            c.close()
        listener.close()
