"""Settings precedence: defaults < TOML file < GATEWAY_* env < CLI flags."""

import dataclasses
from pathlib import Path

import pytest

from gateway import config
from gateway.cli import build_parser, settings_from_args
from gateway.config import ConfigError, Settings, load
from gateway.part_configs import store_config


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


# ------------------------------------------------------------------ gateway settings (listeners etc.)
def test_new_defaults():
    s = load()
    assert (s.grpc_port, s.remoting_port, s.http_port, s.mqtt_port, s.amqp_port) == (
        8081,
        8080,
        8082,
        1883,
        5672,
    )
    assert s.protocols == config.PROTOCOLS
    assert {"grpc", "mqtt", "amqp", "http"} <= set(s.protocols)
    assert s.advertise_host is None
    assert s.auto_create_topics is False
    assert s.max_body_size == 4 * 1024 * 1024
    assert s.default_queues == 8
    assert (s.transaction_timeout_ms, s.transaction_check_interval_ms) == (6000, 5000)
    assert s.drain_timeout_s == 5.0


def test_new_keys_precedence_each_layer(tmp_path):
    path = write_toml(
        tmp_path,
        "grpc_port = 9001\nhttp_port = 9002\nprotocols = ['http']\nmax_body_size = 1000\n"
        "default_queues = 2\ndrain_timeout_s = 1\nauto_create_topics = true\n",
    )
    env = {"GATEWAY_HTTP_PORT": "9102", "GATEWAY_DEFAULT_QUEUES": "3", "GATEWAY_AUTO_CREATE_TOPICS": "false"}
    flags = {"default_queues": 4, "grpc_port": None, "advertise_host": "gw.example"}
    s = load(flags, env, path)
    assert s.grpc_port == 9001  # TOML
    assert s.http_port == 9102  # env over TOML
    assert s.default_queues == 4  # flag over env and TOML
    assert s.auto_create_topics is False  # env "false" over TOML true
    assert s.protocols == ("http",)
    assert s.max_body_size == 1000
    assert s.drain_timeout_s == 1.0 and isinstance(s.drain_timeout_s, float)
    assert s.advertise_host == "gw.example"


@pytest.mark.parametrize(
    ("text", "expected"), [("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False)]
)
def test_bool_from_env(text, expected):
    assert load(env={"GATEWAY_AUTO_CREATE_TOPICS": text}).auto_create_topics is expected


def test_env_values_are_typed():
    env = {
        "GATEWAY_GRPC_PORT": "0",
        "GATEWAY_MAX_BODY_SIZE": "2048",
        "GATEWAY_DRAIN_TIMEOUT_S": "0.5",
        "GATEWAY_TRANSACTION_TIMEOUT_MS": "100",
        "GATEWAY_TRANSACTION_CHECK_INTERVAL_MS": "50",
        "GATEWAY_PROTOCOLS": " HTTP , grpc,http ",
        "GATEWAY_ADVERTISE_HOST": "10.1.2.3",
    }
    s = load(env=env)
    assert s.grpc_port == 0
    assert s.max_body_size == 2048
    assert s.drain_timeout_s == 0.5
    assert (s.transaction_timeout_ms, s.transaction_check_interval_ms) == (100, 50)
    assert s.protocols == ("http", "grpc")
    assert s.advertise_host == "10.1.2.3"


def test_segment_size_default_env_flag_and_growth_to_the_largest_body(tmp_path):
    mib = 1024 * 1024
    assert Settings().segment_size == 128 * mib
    assert load(env={"GATEWAY_SEGMENT_SIZE_MIB": "64"}).segment_size == 64 * mib
    args = build_parser().parse_args(["start", "--segment-size-mib", "32", "--amqp-max-body-size", "1024"])
    assert settings_from_args(args, env={}).segment_size == 32 * mib
    # a segment holds the largest body any listener accepts (AMQP's 16 MiB by default) + 1 MiB
    assert Settings(segment_size_mib=2).segment_size == 17 * mib
    assert Settings(segment_size_mib=2, max_body_size=40 * mib + 1).segment_size == 42 * mib
    with pytest.raises(ConfigError, match="segment_size_mib"):
        Settings(segment_size_mib=0)
    assert store_config(Settings(data_dir=str(tmp_path), segment_size_mib=20)).segment_size == 20 * mib


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"GATEWAY_GRPC_PORT": "eighty"}, "GATEWAY_GRPC_PORT must be an integer"),
        ({"GATEWAY_HTTP_PORT": "70000"}, r"http_port must be \[0, 65535\]"),
        ({"GATEWAY_AUTO_CREATE_TOPICS": "maybe"}, "GATEWAY_AUTO_CREATE_TOPICS must be true/false"),
        ({"GATEWAY_DRAIN_TIMEOUT_S": "soon"}, "GATEWAY_DRAIN_TIMEOUT_S must be a number"),
        ({"GATEWAY_DEFAULT_QUEUES": "0"}, "default_queues"),
        ({"GATEWAY_MAX_BODY_SIZE": "0"}, "max_body_size"),
        ({"GATEWAY_PROTOCOLS": "http,smtp"}, "unknown protocol 'smtp'"),
        ({"GATEWAY_PROTOCOLS": ","}, "at least one"),
    ],
)
def test_bad_env_values_name_the_variable(env, match):
    with pytest.raises(ConfigError, match=match):
        load(env=env)


def test_toml_protocols_as_string_or_list_and_type_errors(tmp_path):
    assert load(toml_path=write_toml(tmp_path, 'protocols = "grpc"\n')).protocols == ("grpc",)
    assert load(toml_path=write_toml(tmp_path, "protocols = ['http', 'grpc']\n")).protocols == (
        "http",
        "grpc",
    )
    with pytest.raises(ConfigError, match="grpc_port must be an integer"):
        load(toml_path=write_toml(tmp_path, 'grpc_port = "8081"\n'))
    with pytest.raises(ConfigError, match="auto_create_topics must be true or false"):
        load(toml_path=write_toml(tmp_path, 'auto_create_topics = "yes"\n'))
    with pytest.raises(ConfigError, match="unknown protocol 'smtp'"):
        load(toml_path=write_toml(tmp_path, "protocols = ['smtp']\n"))


NON_DEFAULT = {
    "data_dir": "/x",
    "host": "0.0.0.0",
    "flush": "async",
    "segment_size_mib": 64,
    "grpc_port": 1,
    "remoting_port": 2,
    "http_port": 3,
    "mqtt_port": 4,
    "amqp_port": 5,
    "protocols": "http",
    "advertise_host": "adv",
    "auto_create_topics": True,
    "max_body_size": 10,
    "default_queues": 2,
    "transaction_timeout_ms": 7,
    "transaction_check_interval_ms": 8,
    "drain_timeout_s": 0.5,
    "event_loop": "asyncio",
    "log_level": "debug",
    "tls_cert": "/etc/gw/cert.pem",
    "tls_key": "/etc/gw/key.pem",
    "mqtt_tls_port": 8884,
    "amqp_tls_port": 5672,
    "https_port": 8444,
    "grpc_plain": True,
    "tls_required": True,
    "tls_client_ca": "/etc/gw/ca.pem",
    "tls_require_client_cert": True,
    "mqtt_cert_identity": True,
    "amqp_mqtt_exchange": "mqtt.bridge",
    "amqp_max_body_size": 1000,
    "mqtt_max_keep_alive": 120,
    "disk_free_limit": "500MiB,2%",
    "tombstone_retention": "90s",
    "metrics_per_object": False,
    "metrics_max_objects": 50,
    "trace_retention": "2h",
    "otlp_endpoint": "http://127.0.0.1:4318",
    "tier_s3_endpoint": "http://127.0.0.1:9000",
    "tier_bucket": "segments",
    "tier_after": "10GiB",
    "mqtt_max_client_id_length": 23,
    "mqtt_max_topic_length": 100,
    "mqtt_max_topic_levels": 5,
    "mqtt_max_retained_messages": 10,
    "mqtt_max_retained_bytes": 1000,
    "mqtt_max_queued_messages": 50,
    "mqtt_max_queued_bytes": 4096,
    "mqtt_queue_full_policy": "refuse-new",
    "amqp_channel_max": 16,
    "amqp_frame_max": 8192,
    "amqp_max_queues_per_vhost": 7,
    "amqp_max_queues_per_user": 3,
    "cloudevents_dedup_window_s": 600,
    "max_connections": 500,
    "max_connections_per_user": 5,
    "fd_reserve": 128,
    "max_connection_rate": 2.5,
    "connection_burst": 4,
    "publish_rate_msgs": 100.0,
    "publish_rate_bytes": 65536,
    "publish_burst": 2.0,
    "max_outbound_bytes_per_connection": 65536,
    "mode": "cluster",
    "workers": 3,
    "namesrv": "ns:9876",
    "cluster_name": "c1",
    "store_name": "store-x",
    "store_port": 10999,
    "store_group": "group-x",
    "controller": "http://127.0.0.1:2379",
    "replication": "async",
    "min_insync": 3,
    "proxy_name": "proxy-x",
    "lease_period_s": 1.5,
    "lease_expiry_s": 4.5,
    "route_refresh_s": 0.5,
    "cluster_secret_file": "/run/secrets/cluster_secret",
    "cluster_tls": True,
    "cluster_tls_ca": "/etc/cluster/ca.pem",
    "auth": True,
    "allow_anonymous": True,
    "jwt_jwks": "/etc/gateway/jwks.json",
    "jwt_public_key": "/etc/gateway/jwt.pem",
    "jwt_secret_file": "/run/secrets/jwt_secret",
    "jwt_user_claim": "username",
    "jwt_device_claim": "device_id",
    "jwt_audience": "gateway",
    "jwt_issuer": "https://idp.example",
    "jwt_leeway_s": 5.0,
    "mqtt_ws": False,
    "mqtt_ws_port": 18083,
    "mqtt_wss_port": 18084,
    "mqtt_ws_path": "/ws/mqtt",
    "sys_interval": 30,
    "client_events": True,
}
# Settings only `gateway store` takes as flags (`--name`, `--port`); the others are flags of `start`.
STORE_ONLY = {
    "store_name": "--name",
    "store_port": "--port",
    "store_group": "--group",
    "controller": "--controller",
    "replication": "--replication",
    "min_insync": "--min-insync",
}


def test_every_setting_has_a_flag_env_var_and_toml_key(tmp_path):
    from gateway.config import FIELDS

    assert set(NON_DEFAULT) == set(FIELDS)
    defaults = Settings()
    # TOML: every key by its own name.
    lines = [f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in NON_DEFAULT.items()]
    from_toml = load(toml_path=write_toml(tmp_path, "\n".join(lines).replace("'", '"') + "\n"))
    # Env: GATEWAY_<NAME> for every key.
    env = {f"GATEWAY_{k.upper()}": str(v) for k, v in NON_DEFAULT.items()}
    from_env = load(env=env)
    # Flags: --<name-with-dashes> for every key.
    argv = ["start"]
    for k, v in NON_DEFAULT.items():
        if k not in STORE_ONLY:
            flag = k.replace("_", "-")
            argv += [f"--{flag}"] if v is True else [f"--no-{flag}"] if v is False else [f"--{flag}", str(v)]
    # Flags of `gateway store` for the store-only ones, through a config file holding the rest.
    rest = [line for line in lines if line.split(" ")[0] not in STORE_ONLY]
    store_argv = ["store", "--config", str(write_toml(tmp_path, "\n".join(rest).replace("'", '"') + "\n"))]
    for k, flag in STORE_ONLY.items():
        store_argv += [flag, str(NON_DEFAULT[k])]
    from_store_flags = settings_from_args(build_parser().parse_args(store_argv), {})
    from_flags = settings_from_args(build_parser().parse_args(argv), {})
    from_flags = dataclasses.replace(from_flags, **{k: getattr(from_store_flags, k) for k in STORE_ONLY})
    assert from_toml == from_env == from_flags
    for f in FIELDS:
        assert getattr(from_toml, f) != getattr(defaults, f), f


def test_cli_start_flags_for_all_new_settings():
    argv = [
        "start",
        "--grpc-port", "1", "--remoting-port", "2", "--http-port", "3", "--mqtt-port", "4",
        "--amqp-port", "5", "--protocols", "http", "--advertise-host", "adv", "--auto-create-topics",
        "--max-body-size", "77", "--default-queues", "6", "--transaction-timeout-ms", "8",
        "--transaction-check-interval-ms", "9", "--drain-timeout-s", "2.5", "--event-loop", "asyncio",
        "--log-level", "debug",
    ]  # fmt: skip
    s = settings_from_args(build_parser().parse_args(argv), {"GATEWAY_HTTP_PORT": "99"})
    assert (s.grpc_port, s.remoting_port, s.http_port, s.mqtt_port, s.amqp_port) == (1, 2, 3, 4, 5)
    assert s.protocols == ("http",)
    assert s.advertise_host == "adv"
    assert s.auto_create_topics is True
    assert (s.max_body_size, s.default_queues) == (77, 6)
    assert (s.transaction_timeout_ms, s.transaction_check_interval_ms) == (8, 9)
    assert s.drain_timeout_s == 2.5
    assert (s.event_loop, s.log_level) == ("asyncio", "debug")
    off = build_parser().parse_args(["start", "--no-auto-create-topics"])
    assert settings_from_args(off, {"GATEWAY_AUTO_CREATE_TOPICS": "1"}).auto_create_topics is False
    unset = build_parser().parse_args(["start"])
    assert settings_from_args(unset, {"GATEWAY_AUTO_CREATE_TOPICS": "1"}).auto_create_topics is True


def test_cli_rejects_bad_protocols_as_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["start", "--protocols", "amqp,smtp"])
    assert exc.value.code == 2
    assert "unknown protocol 'smtp'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "cluster"}, "mode cluster needs namesrv"),
        ({"mode": "swarm"}, "mode must be one of"),
        ({"lease_period_s": 10, "lease_expiry_s": 5}, "must not be shorter"),
        ({"route_refresh_s": 0}, "route_refresh_s must be"),
        ({"store_name": "a@b"}, "store_name must be"),
        ({"store_port": 70000}, "store_port must be"),
        ({"store_group": "g"}, "store_group needs controller"),
        ({"store_group": "a b", "controller": "x"}, "store_group must be"),
        ({"replication": "maybe"}, "replication must be one of"),
        ({"min_insync": 0}, "min_insync must be"),
        ({"namesrv": " "}, "namesrv must be"),
    ],
)
def test_cluster_settings_are_validated(values, message):
    with pytest.raises(ConfigError, match=message):
        Settings(**values)


@pytest.mark.parametrize("bad", [0, -1, 257, "two", "", True, 1.5])
def test_workers_must_be_a_count_or_auto(bad):
    with pytest.raises(ConfigError, match="workers must be an integer"):
        Settings(workers=bad)


def test_workers_auto_is_one_per_core_and_text_counts_parse():
    import os

    assert Settings(workers="auto").workers == len(os.sched_getaffinity(0))
    assert Settings(workers=" AUTO ").workers == len(os.sched_getaffinity(0))
    assert Settings(workers="3").workers == 3
    assert load(env={"GATEWAY_WORKERS": "2"}).workers == 2
    assert Settings().workers == 1


def test_store_command_reads_its_flags_and_env():
    args = build_parser().parse_args(["store", "--port", "10912", "--name", "s1", "--namesrv", "n:1"])
    s = settings_from_args(args, {"GATEWAY_LEASE_PERIOD_S": "2", "GATEWAY_STORE_PORT": "1"})
    assert (s.store_port, s.store_name, s.namesrv, s.lease_period_s) == (10912, "s1", "n:1", 2.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["store", "--grpc-port", "1"])  # not a store node setting


def test_secure_by_default_exposure_check():
    from gateway.config import check_exposure, is_loopback

    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "gateway.example", "128.0.0.1"):
        assert not is_loopback(host), host
    check_exposure(Settings())  # make run: loopback, anonymous
    check_exposure(Settings(host="0.0.0.0", auth=True))
    check_exposure(Settings(host="0.0.0.0", allow_anonymous=True))
    with pytest.raises(ConfigError, match=r"refusing to start: .* bind 0\.0\.0\.0 .*--allow-anonymous"):
        check_exposure(Settings(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="auth must be true or false"):
        Settings(auth="yes")  # type: ignore[arg-type]
    args = build_parser().parse_args(["start", "--host", "0.0.0.0", "--auth", "--no-allow-anonymous"])
    s = settings_from_args(args, {"GATEWAY_ALLOW_ANONYMOUS": "true"})
    assert (s.auth, s.allow_anonymous) == (True, False)
