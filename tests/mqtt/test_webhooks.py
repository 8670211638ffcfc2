"""Webhooks against a local HTTP server that fails, stalls, resets and answers 500
at random: every record is taken (2xx) under its idempotency key with a valid
signature, never more than ``concurrency`` at once; an endpoint that always fails
sends its records to the dead-letter topic after the retries."""

from __future__ import annotations

import hmac
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lockmq.client import Producer
from lockmq.mqtt.webhooks import sign
from lockmq.testing import FAST_TIMERS, BrokerThread, merge_tables, wait_for

SECRET = "s3cret"
N = 120
CONCURRENCY = 3


class Flaky:
    """An HTTP server on 127.0.0.1 answering at random (``always`` status: fixed)."""

    def __init__(self, seed: int, always: int = 0) -> None:
        self.rng = random.Random(seed)
        self.always = always
        self.taken: dict[str, int] = {}   # idempotency key -> 2xx answers given
        self.bad_signatures = 0
        self.active = self.max_active = self.requests = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                outer.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.active += 1
            self.requests += 1
            self.max_active = max(self.max_active, self.active)
            r = self.rng.random()
        done = False
        try:
            body = h.rfile.read(int(h.headers["Content-Length"]))
            want = sign(SECRET.encode(), h.headers["X-Lockmq-Timestamp"], body)
            if not hmac.compare_digest(want, h.headers.get("X-Lockmq-Signature", "")):
                self.bad_signatures += 1
            key = h.headers["Idempotency-Key"]
            if self.always:
                h.send_response(self.always)
            elif r < 0.2:
                h.send_response(500)
            elif r < 0.3:                       # stall past the sink's timeout
                with self.lock:
                    self.active -= 1
                done = True
                time.sleep(0.6)
                h.send_response(200)
            elif r < 0.35:                      # reset: no answer at all
                h.close_connection = True
                return
            elif r < 0.4:
                h.send_response(503)
                h.send_header("Retry-After", "0")
            else:
                with self.lock:
                    self.taken[key] = self.taken.get(key, 0) + 1
                h.send_response(200)
            h.send_header("Content-Length", "0")
            h.end_headers()
        finally:
            if not done:
                with self.lock:
                    self.active -= 1

    def close(self) -> None:
        self.httpd.shutdown()


def test_every_record_is_taken_once_per_key_despite_a_flaky_endpoint(tmp_path):
    flaky = Flaky(seed=7)
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, {
        "consumers": {"time_scale": 0.01, "max_retries": 20},
        "webhooks": {"enabled": True, "endpoints": [f"flaky={flaky.url}"],
                     "topics": ["door.events"], "secret": SECRET,
                     "concurrency": CONCURRENCY, "timeout_s": 0.3}})).start()
    try:
        with Producer(b.address, producer_id="hook-test") as prod:
            for i in range(N):
                prod.send_async("door.events", b"w%d" % i)
        want = {f"hook-test:{i}" for i in range(N)}
        wait_for(lambda: want <= set(flaky.taken), f"{N} records taken", timeout=90)
        assert flaky.bad_signatures == 0
        assert flaky.max_active <= CONCURRENCY
        sink = b.broker.mqtt.webhooks
        assert max(e.max_busy for e in sink.endpoints) <= CONCURRENCY
        assert flaky.requests > N        # it did fail: the retries came
        assert b.call(lambda: b.broker.core.clusters["webhooks.flaky.door.events"].backlog()) == 0
    finally:
        b.stop()
        flaky.close()


def test_an_endpoint_that_always_fails_dead_letters_after_the_retries(tmp_path):
    dead = Flaky(seed=1, always=500)
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, {
        "consumers": {"time_scale": 0.01, "max_retries": 2},
        "webhooks": {"enabled": True, "endpoints": [f"dead={dead.url}"],
                     "topics": ["door.events"], "timeout_s": 1.0}})).start()
    try:
        with Producer(b.address, producer_id="dlq-test") as prod:
            for i in range(5):
                prod.send_sync("door.events", b"d%d" % i)
        dlq = "$dlq.webhooks.dead.door.events"
        wait_for(lambda: b.call(lambda: b.broker.core.queue_end(dlq)) == 5, "5 dead letters")
        assert dead.requests == 5 * 3    # the first POST and two retries each
        assert not dead.taken
    finally:
        b.stop()
        dead.close()
