"""runtime/settings.py: the settings plumbing the gateway and the name server share, seen through
both (gateway/config.py, namesrv/config.py), so that one rule gives one answer in each."""

from __future__ import annotations

import argparse

import pytest

from gateway.config import load as load_gateway
from namesrv.config import load as load_namesrv
from runtime import ConfigError
from runtime.settings import add_flags, read_toml


@pytest.mark.parametrize("load", [load_gateway, load_namesrv])
def test_one_lease_rule(load):
    s = load({"lease_period_s": 10, "lease_expiry_s": 20})
    assert (s.lease_period_s, s.lease_expiry_s) == (10.0, 20.0)
    assert isinstance(s.lease_period_s, float)
    with pytest.raises(
        ConfigError, match=r"lease_expiry_s \(5\) must not be shorter than lease_period_s \(10\)"
    ):
        load({"lease_period_s": 10, "lease_expiry_s": 5})
    with pytest.raises(ConfigError, match=r"lease_period_s must be a number of seconds in \(0, 86400\]"):
        load({"lease_period_s": 0})


@pytest.mark.parametrize(("load", "prefix"), [(load_gateway, "GATEWAY_"), (load_namesrv, "GATEWAY_NAMESRV_")])
def test_one_text_rule(load, prefix):
    assert load(env={prefix + "LEASE_EXPIRY_S": " 300 ", prefix + "HOST": ""}).lease_expiry_s == 300.0
    with pytest.raises(ConfigError, match=prefix + "LEASE_EXPIRY_S must be a number, got 'soon'"):
        load(env={prefix + "LEASE_EXPIRY_S": "soon"})
    with pytest.raises(ConfigError, match=prefix + "TLS_REQUIRE_CLIENT_CERT must be true/false/1/0"):
        load(env={prefix + "TLS_REQUIRE_CLIENT_CERT": "maybe"})
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load({"colour": "red"})


@pytest.mark.parametrize("load", [load_gateway, load_namesrv])
def test_one_tls_rule(load):
    with pytest.raises(ConfigError, match="tls_key needs tls_cert"):
        load({"tls_key": "k.pem"})
    with pytest.raises(ConfigError, match="tls_cert must be a file path"):
        load({"tls_cert": ""})


def test_read_toml_takes_a_table_and_refuses_unknown_keys(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[namesrv]\nport = 1\n")
    assert read_toml(f, ("port",), table="namesrv") == {"port": 1}
    assert read_toml(f, ("namesrv",)) == {"namesrv": {"port": 1}}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in .*: port"):
        read_toml(f, ("host",), table="namesrv")
    f.write_text("port = ")
    with pytest.raises(ConfigError, match="invalid TOML in"):
        read_toml(f, ("port",))
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_toml(tmp_path / "missing.toml", ("port",))


def test_add_flags_reports_a_parse_error_as_a_usage_error(capsys):
    def even(text: str) -> int:
        if int(text) % 2:
            raise ConfigError(f"{text} is odd")
        return int(text)

    parser = argparse.ArgumentParser(prog="p")
    add_flags(parser, [("pair_size", "size", {"type": even}), ("count", "count", {"type": int})])
    assert vars(parser.parse_args(["--pair-size", "4"])) == {"size": 4, "count": None}
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--pair-size", "3"])
    assert e.value.code == 2
    assert "argument --pair-size: 3 is odd" in capsys.readouterr().err
