"""Settings precedence: defaults < TOML file < GATEWAY_* env < CLI flags."""

from pathlib import Path

import pytest

from gateway.cli import build_parser, settings_from_args
from gateway.config import ConfigError, Settings, load


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_defaults():
    assert load() == Settings(data_dir="./data", host="127.0.0.1", flush="sync")


def test_toml_overrides_defaults(tmp_path):
    path = write_toml(tmp_path, 'data_dir = "/srv/toml"\nflush = "async"\n')
    assert load(toml_path=path) == Settings(data_dir="/srv/toml", host="127.0.0.1", flush="async")


def test_env_overrides_toml(tmp_path):
    path = write_toml(tmp_path, 'data_dir = "/srv/toml"\nhost = "10.0.0.1"\nflush = "async"\n')
    env = {"GATEWAY_DATA_DIR": "/srv/env", "GATEWAY_FLUSH": "sync"}
    assert load(env=env, toml_path=path) == Settings(data_dir="/srv/env", host="10.0.0.1", flush="sync")


def test_flags_override_env_and_toml(tmp_path):
    path = write_toml(tmp_path, 'data_dir = "/srv/toml"\nhost = "10.0.0.1"\nflush = "async"\n')
    env = {"GATEWAY_DATA_DIR": "/srv/env", "GATEWAY_HOST": "10.0.0.2", "GATEWAY_FLUSH": "async"}
    flags = {"data_dir": "/srv/flag", "host": None, "flush": "sync"}
    assert load(flags, env, path) == Settings(data_dir="/srv/flag", host="10.0.0.2", flush="sync")


def test_every_layer_each_field_wins_at_its_level(tmp_path):
    # One field settled at each layer: host by TOML, flush by env, data_dir by flag.
    path = write_toml(tmp_path, 'host = "toml-host"\nflush = "sync"\ndata_dir = "/toml"\n')
    env = {"GATEWAY_FLUSH": "async", "GATEWAY_DATA_DIR": "/env"}
    settings = load({"data_dir": "/flag"}, env, path)
    assert settings == Settings(data_dir="/flag", host="toml-host", flush="async")


def test_unrelated_and_empty_env_vars_are_ignored():
    env = {"GATEWAY_HOST": "", "GATEWAY_UNKNOWN": "x", "DATA_DIR": "/nope", "HOST": "nope"}
    assert load(env=env) == Settings()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"argv_overrides": {"flush": "sometimes"}},
        {"env": {"GATEWAY_FLUSH": "never"}},
        {"argv_overrides": {"port": 1}},
        {"argv_overrides": {"data_dir": ""}},
    ],
)
def test_invalid_values_are_rejected(kwargs):
    with pytest.raises(ConfigError):
        load(**kwargs)


def test_bad_toml_files_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown key"):
        load(toml_path=write_toml(tmp_path, "port = 1\n"))
    with pytest.raises(ConfigError, match="invalid TOML"):
        load(toml_path=write_toml(tmp_path, "data_dir = \n"))
    with pytest.raises(ConfigError, match="non-empty string"):
        load(toml_path=write_toml(tmp_path, "data_dir = 5\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load(toml_path=tmp_path / "missing.toml")


def test_cli_flags_feed_the_top_layer(tmp_path):
    path = write_toml(tmp_path, 'data_dir = "/toml"\nhost = "toml-host"\n')
    args = build_parser().parse_args(["start", "--config", str(path), "--flush", "async"])
    env = {"GATEWAY_HOST": "env-host", "GATEWAY_FLUSH": "sync"}
    assert settings_from_args(args, env) == Settings(data_dir="/toml", host="env-host", flush="async")


def test_cli_rejects_unknown_flush_policy(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["start", "--flush", "maybe"])
    assert exc.value.code == 2
