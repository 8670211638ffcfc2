"""The configuration file: defaults, overrides, errors that name the setting."""

from __future__ import annotations

import subprocess
import sys
import os

import pytest

from lockmq.config import Config, config_from_dict, default_toml, load_config

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def test_defaults_are_the_papers():
    c = Config()
    c.validate()
    assert c.broker.port == 6800 and c.broker.data_dir == "./data"
    assert c.devices.heartbeat_s == 30 and c.devices.evict_after_s == 120
    assert c.consumers.max_retries == 16
    assert c.consumers.retry_levels_s[:4] == [1, 5, 10, 30] and c.consumers.retry_levels_s[-1] == 7200


def test_toml_file_and_overrides(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('[broker]\nport = 7000\n[consumers]\ntime_scale = 0.01\n[store]\nflush = "async"\n')
    c = load_config(str(f), {"broker": {"data_dir": str(tmp_path)}})
    assert c.broker.port == 7000 and c.consumers.time_scale == 0.01
    sc = c.store_config()
    assert sc.flush == "async" and str(sc.data_dir) == str(tmp_path)


@pytest.mark.parametrize("tables,needle", [
    ({"broker": {"prot": 1}}, "broker.prot"),
    ({"brokr": {}}, "[brokr]"),
    ({"broker": {"auth": "maybe"}}, "broker.auth"),
    ({"broker": {"port": "6800"}}, "broker.port"),
    ({"consumers": {"max_retries": -1}}, "consumers.max_retries"),
    ({"devices": {"evict_after_s": 10.0}}, "evict_after_s"),
])
def test_bad_settings_are_named(tables, needle):
    with pytest.raises(ValueError) as ei:
        config_from_dict(tables)
    assert needle in str(ei.value)


def test_unknown_store_setting_is_named():
    with pytest.raises(ValueError, match="store.flsh"):
        config_from_dict({"store": {"flsh": "sync"}}).store_config()


def test_print_config_round_trips(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text(default_toml())
    # --print-config now writes [store], [security] and [replication] in full (issue
    # 35): the file gives the same effective settings as no file at all
    loaded, default = load_config(str(f)), Config()
    plain = ("store", "security", "replication")
    assert {k: v for k, v in loaded.to_dict().items() if k not in plain} == \
        {k: v for k, v in default.to_dict().items() if k not in plain}
    assert loaded.store_config() == default.store_config()
    assert loaded.security_config() == default.security_config()
    from lockmq.replication.settings import ReplicationSettings
    assert ReplicationSettings.from_table(loaded.replication) == \
        ReplicationSettings.from_table(default.replication)
    out = subprocess.run([LOCKMQ, "broker", "--print-config"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "[consumers]" in out.stdout
    bad = subprocess.run([LOCKMQ, "broker", "--port", "70000", "--check-config"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "broker.port" in bad.stderr


def test_any_free_port_is_minus_1_and_0_keeps_its_meaning():
    for status_port in (-1, 0, 6801):
        config_from_dict({"broker": {"status_port": status_port}})
    for tls_port in (-1, 0, 6843):
        config_from_dict({"security": {"tls_port": tls_port}}).security_config()


@pytest.mark.parametrize("tables,named", [
    ({"broker": {"status_port": -2}}, "broker.status_port = -2"),
    ({"broker": {"status_port": 70000}}, "broker.status_port = 70000"),
    ({"security": {"tls_port": -2}}, "security.tls_port = -2"),
])
def test_a_port_out_of_range_is_named_with_its_spellings(tables, named):
    with pytest.raises(ValueError) as ei:
        config_from_dict(tables).security_config()
    assert named in str(ei.value) and "-1 (any free port)" in str(ei.value)
