"""`gateway start --auth --allow-anonymous` as a real process and `gateway acl add --anonymous`
end to end: the rule is stored, listed, exported, imported and deleted like any other, and an
anonymous paho client gets what it says (the Paho suite's `test/nosubscribe` refused)."""

from __future__ import annotations

import json

import httpx
import paho.mqtt.client as paho

from tests.adapters.test_anonymous_access import paho_subscribe
from tests.gateway.support import start
from tests.gateway.test_auth_process import ADMIN_PW, cli

ADMIN = {"GATEWAY_USER": "admin", "GATEWAY_PASSWORD": ADMIN_PW}


def test_acl_add_anonymous_end_to_end(tmp_path):
    env = {"GATEWAY_ADMIN_PASSWORD": ADMIN_PW, "GATEWAY_ALLOW_ANONYMOUS": "true"}
    proc, listeners = start(tmp_path, "--auth", "--mqtt-port", "0", env=env, protocols="http,mqtt")
    url = f"http://{listeners['http']}"
    mqtt_port = int(listeners["mqtt"].rsplit(":", 1)[1])
    try:
        add = ("acl", "add", "--anonymous", "--topic")
        r = cli(*add, "test/#", "--actions", "subscribe,publish", url=url, env=ADMIN)
        assert r.returncode == 0, r.stderr
        r = cli(*add, "test/nosubscribe", "--actions", "subscribe", "--deny", url=url, env=ADMIN)
        assert r.returncode == 0, r.stderr
        assert "anonymous" in r.stdout
        r = cli("acl", "list", "--json", url=url, env=ADMIN)
        rules = {x["pattern"]: x for x in json.loads(r.stdout)}
        assert {(x["subject"], x["effect"]) for x in rules.values()} == {
            ("anonymous", "allow"),
            ("anonymous", "deny"),
        }
        assert paho_subscribe(mqtt_port, paho.MQTTv311, "test/nosubscribe") == [0x80]
        assert paho_subscribe(mqtt_port, paho.MQTTv5, "test/nosubscribe") == [0x87]
        assert paho_subscribe(mqtt_port, paho.MQTTv5, "test/ok") == [2]
        # the admin API stays closed to anonymous requests
        assert httpx.get(url + "/admin/acl", timeout=5).status_code == 401

        exported = cli("acl", "export", url=url, env=ADMIN).stdout
        assert exported.count('subject = "anonymous"') == 2
        deny = rules["test/nosubscribe"]["id"]
        r = cli("acl", "delete", deny, url=url, env=ADMIN)
        assert r.returncode == 0, r.stderr
        assert paho_subscribe(mqtt_port, paho.MQTTv5, "test/nosubscribe") == [2]
        policy = tmp_path / "policy.toml"
        policy.write_text(exported)
        r = cli("acl", "import", str(policy), url=url, env=ADMIN)
        assert r.returncode == 0, r.stderr
        assert cli("acl", "export", url=url, env=ADMIN).stdout == exported
        assert paho_subscribe(mqtt_port, paho.MQTTv5, "test/nosubscribe") == [0x87]
    finally:
        assert proc.stop() == 0
