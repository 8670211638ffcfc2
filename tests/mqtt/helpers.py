"""Helpers of the MQTT tests: the listener's port, paho clients that ack by hand,
mosquitto_sub/mosquitto_pub as child processes."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
from typing import Any

import pytest

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402

from lockmq.testing import BrokerProcess, wait_for  # noqa: E402

MOSQUITTO_SUB = "/usr/bin/mosquitto_sub"
MOSQUITTO_PUB = "/usr/bin/mosquitto_pub"
MOSQUITTO_RR = "/usr/bin/mosquitto_rr"
#: the listener on a free port (pass a copy, merge_tables(MQTT_ON), to whatever keeps it)
MQTT_ON = {"mqtt": {"enabled": True, "port": -1}}


def needs(binary: str) -> str:
    """``binary`` if it is installed, else skip the test saying which package has it
    (scripts/system-deps.sh installs it)."""
    import os
    if not os.path.exists(binary):
        pytest.skip(f"{binary} is not installed (Debian: mosquitto-clients)")
    return binary


def mqtt_port(proc: BrokerProcess, start: int = 0) -> int:
    """The MQTT port a broker process bound (its ``mqtt_started`` line)."""
    line = proc.wait_log(r"event=mqtt_started", start=start)
    return int(re.search(r"\bport=(\d+)", line).group(1))


class Client:
    """A paho client (v3.1.1 or v5) whose messages land in :attr:`inbox`; with
    ``manual_ack`` the test acks each (``ack(msg)``)."""

    def __init__(self, port: int, v5: bool, client_id: str = "", clean: bool = True,
                 username: str | None = None, password: str | None = None,
                 manual_ack: bool = False, expiry_s: int = 0, receive_max: int = 0) -> None:
        proto = paho.MQTTv5 if v5 else paho.MQTTv311
        kwargs: dict[str, Any] = {} if v5 else {"clean_session": clean}
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=proto, **kwargs)
        self.v5 = v5
        self.inbox: "queue.Queue[Any]" = queue.Queue()
        self.connack: "queue.Queue[Any]" = queue.Queue()
        self.subacks: "queue.Queue[Any]" = queue.Queue()
        self.pubacks: dict[int, Any] = {}
        self.disconnects: "queue.Queue[Any]" = queue.Queue()
        if manual_ack:
            self.c.manual_ack_set(True)
        if username is not None:
            self.c.username_pw_set(username, password)
        self.c.on_message = lambda c, u, m: self.inbox.put(m)
        self.c.on_connect = lambda c, u, f, rc, p=None: self.connack.put((f, rc))
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: self.subacks.put(rcs)
        self.c.on_publish = lambda c, u, mid, rc, p=None: self.pubacks.__setitem__(mid, rc)
        self.c.on_disconnect = lambda c, u, f, rc, p=None: self.disconnects.put(rc)
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if expiry_s:
                props.SessionExpiryInterval = expiry_s
            if receive_max:
                props.ReceiveMaximum = receive_max
            self.c.connect("127.0.0.1", port, 30, clean_start=clean, properties=props)
        else:
            self.c.connect("127.0.0.1", port, 30)
        self.c.loop_start()

    def wait_connack(self, timeout: float = 10.0) -> Any:
        """(flags, reason code) of the CONNACK."""
        return self.connack.get(timeout=timeout)

    def subscribe(self, flt: str, qos: int = 1) -> Any:
        """Subscribe and return the SUBACK's reason codes."""
        self.c.subscribe(flt, qos)
        return self.subacks.get(timeout=10)

    def ack(self, msg: Any) -> None:
        """PUBACK ``msg`` (manual_ack)."""
        self.c.ack(msg.mid, msg.qos)

    def close(self) -> None:
        """Disconnect cleanly and stop the network thread."""
        try:
            self.c.disconnect()
        finally:
            self.c.loop_stop()


def user_props(msg: Any) -> dict[str, str]:
    """The MQTT 5 user properties of a received message."""
    props = getattr(msg, "properties", None)
    return dict(getattr(props, "UserProperty", []) or [])


class LineReader:
    """A child process's stdout lines, read by a thread into a list."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, n: int, what: str = "lines", timeout: float = 30.0) -> None:
        """Until ``n`` lines were read."""
        wait_for(lambda: len(self.lines) >= n, f"{n} {what}", timeout=timeout)

    def join(self) -> None:
        """Wait for the end of the output (the process has exited)."""
        self._t.join(10)
