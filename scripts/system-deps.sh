#!/usr/bin/env bash
# Optional system services for the full test suite, from Debian's packages:
# PostgreSQL (the idempotency helper's production store) and QEMU with the
# micro:bit MicroPython image (the HIL rig's QEMU transport), gcc-multilib (the 32-bit
# firmware interpreter), Mosquitto and Redis (the broker benchmark's peers). Needs root and
# apt-get; without them the tests that need these skip and say why.
# Prints `export ...` lines for the test environment on stdout.
set -euo pipefail

log() { echo "system-deps: $*" >&2; }

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  log "not root or no apt-get: PostgreSQL and QEMU tests will skip"
  exit 0
fi

want=()
command -v pg_ctlcluster >/dev/null || want+=(postgresql)
command -v qemu-system-arm >/dev/null || want+=(qemu-system-arm)
[ -e /usr/share/firmware-microbit-micropython/firmware.hex ] || want+=(firmware-microbit-micropython)
command -v chromium >/dev/null || want+=(chromium)   # the dashboard test (headless)
# the broker benchmark's peers (bench/peers.py); it skips one that is missing
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || want+=(mosquitto)
command -v redis-server >/dev/null || want+=(redis-server)
# gcc -m32: the 32-bit MicroPython with the lock app frozen in (mpy32-frozen test runs)
dpkg -s gcc-multilib >/dev/null 2>&1 || want+=(gcc-multilib)
# libfaketime: wall-clock steps under a running broker (tests/broker clock tests)
command -v faketime >/dev/null || want+=(faketime)
# mosquitto_sub/mosquitto_pub: real MQTT clients against the MQTT listener and bridge
command -v mosquitto_sub >/dev/null || want+=(mosquitto-clients)
# promtool: the metrics, alert rules and dashboard under dist/ are checked in the suite
command -v promtool >/dev/null || want+=(prometheus)
if [ ${#want[@]} -gt 0 ]; then
  log "installing ${want[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}") >&2 \
    || log "apt-get failed: those tests will skip"
fi

if command -v pg_ctlcluster >/dev/null; then
  version=$(ls /etc/postgresql 2>/dev/null | sort -n | tail -1)
  if [ -n "$version" ]; then
    pg_ctlcluster "$version" main start >&2 2>&1 || true
    for _ in $(seq 1 30); do
      su postgres -c "psql -qtAc 'select 1'" >/dev/null 2>&1 && break
      sleep 0.5
    done
    su postgres -c "psql -qtAc \"select 1 from pg_roles where rolname='lockmq'\"" | grep -q 1 \
      || su postgres -c "psql -qc \"create role lockmq login password 'lockmq'\"" >&2
    su postgres -c "psql -qtAc \"select 1 from pg_database where datname='lockmq_test'\"" | grep -q 1 \
      || su postgres -c "createdb -O lockmq lockmq_test" >&2
    echo "export LOCKMQ_TEST_PG_DSN=postgresql://lockmq:lockmq@127.0.0.1:5432/lockmq_test"
  fi
fi
