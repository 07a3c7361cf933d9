"""DNS rebinding: a page on attacker.example that makes its name resolve to 127.0.0.1 calls
the server as its own origin (no CORS involved) with `Host: attacker.example:PORT`. The
gateway answers only for IP literals, localhost names and --allowed-hosts; any other Host
gets a 421 error object that names nothing, on every route, preflights included."""
from __future__ import annotations

from tests.reliability.served import Served

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_foreign_host_is_refused_on_every_route(main_server: Served) -> None:
    port = main_server.port
    for host in (f"attacker.example:{port}", "attacker.example", f"localhost.attacker.example:{port}",
                 f"api.kvserve.test.attacker.example:{port}", "evil-svc.kvserve.test.example", "x"):
        h = {"Host": host}
        replies = [main_server.post("/v1/chat/completions", CHAT, headers=h),
                   main_server.post("/tokenize", {"model": "tiny", "prompt": "hi"}, headers=h),
                   main_server.get("/v1/models", headers=h), main_server.get("/health", headers=h, key=None),
                   main_server.get("/metrics", headers=h, key=None), main_server.get("/nope", headers=h),
                   main_server.request("OPTIONS", "/v1/completions", key=None,
                                       headers={**h, "Origin": "http://attacker.example",
                                                "Access-Control-Request-Method": "POST"})]
        for reply in replies:
            assert reply.status == 421, (host, reply.status, reply.body[:200])
            assert reply.json()["error"]["code"] == "misdirected_request"
            assert b"attacker" not in reply.body and b"kvserve.test" not in reply.body


def test_loopback_ip_and_allowed_hosts_are_answered(main_server: Served) -> None:
    port = main_server.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"app.localhost:{port}", f"[::1]:{port}",
                 "10.1.2.3:8000", f"api.kvserve.test:{port}", "api.kvserve.test.", "gw.svc.kvserve.test",
                 "svc.kvserve.test"):
        reply = main_server.post("/v1/chat/completions", CHAT, headers={"Host": host})
        assert reply.status == 200, (host, reply.status, reply.body[:200])
    assert main_server.get("/health", headers={"Host": "localhost"}, key=None).status == 200
