"""Nobody gets in, nothing leaks out.

- API keys are compared in constant time (no early exit, fixed-length digests).
- With keys set, every route but /health, /metrics and /version needs one,
  /openapi.json included; an unknown route answers exactly like a known one
  without a key, so a client without a key learns nothing about the routes.
- The internal gRPC port (and every other socket of the server) binds to
  127.0.0.1 by default.
- No pickle: not in the source, and at runtime no process of the server
  unpickles anything (an audit hook loaded into every process records it).
- Error bodies and logs carry no traceback, no file path and no prompt.
"""
from __future__ import annotations

import ast
import inspect
import ipaddress
import re
import socket
import textwrap
from pathlib import Path

import psutil

from kvserve.frontend.http import api_keys, middleware
from tests.reliability.conftest import MAIN_KEY, TENANT_KEYS
from tests.reliability.served import REPO, Served

PUBLIC = {"/health", "/metrics", "/version"}
CANARY = "CANARY-93bd10-SECRET-PROMPT"
LEAKS = (CANARY, "Traceback", 'File "', ".py", "/work/", "site-packages")


def test_api_keys_are_compared_in_constant_time() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(api_keys.match_key)))
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)]
    assert len(loops) == 1, "one pass over every key"
    inside = list(ast.walk(loops[0]))
    assert not any(isinstance(n, (ast.Break, ast.Return)) for n in inside), "no early exit"
    calls = [n for n in inside if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert any(c.func.attr == "compare_digest" for c in calls)
    assert not any(isinstance(n, ast.Compare) for n in inside), "no == / in on secrets"
    # Digests have one length whatever the key: compare_digest then also hides the key length.
    digests = [(api_keys.key_digest("k" * n), "t") for n in (1, 64)]
    assert {len(d) for d, _ in digests} == {32}
    assert api_keys.match_key("k" * 64, digests) == "t" and api_keys.match_key("k" * 63, digests) is None
    auth_src = inspect.getsource(middleware.auth)
    assert "match_key(" in auth_src and "==" not in auth_src.replace("scheme.lower() ==", "")


def test_every_route_but_health_metrics_version_needs_a_key(main_server: Served) -> None:
    doc = main_server.get("/openapi.json").json()
    routes = [(m.upper(), p.replace("{model}", "tiny")) for p, item in doc["paths"].items() for m in item
              if m in ("get", "post")]
    assert len(routes) >= 10
    # One 401 body per error shape: Anthropic's under /v1/messages (chosen by the path alone, known
    # route or not, so it tells nothing either), OpenAI's everywhere else.
    unauthorized: dict[bool, bytes] = {}
    for method, path in routes + [("GET", "/no/such/route"), ("POST", "/v1/secret-admin"), ("DELETE", "/v1/models"),
                                  ("GET", "/v1/completions"), ("GET", "/openapi.json"),
                                  ("POST", "/v1/messages/no-such"), ("DELETE", "/v1/responses/resp_x")]:
        for key in (None, "sk-wrong", MAIN_KEY[:-1], MAIN_KEY + "x"):
            reply = main_server.request(method, path, {} if method == "POST" else None, key=key)
            if path in PUBLIC:
                assert reply.status in (200, 503), (method, path, reply.status)
                continue
            assert reply.status == 401, (method, path, key, reply.status)
            assert reply.headers["www-authenticate"] == "Bearer"
            # Unknown routes answer exactly like known ones: nothing to learn without a key.
            anthropic_shape = path == "/v1/messages" or path.startswith("/v1/messages/")
            assert unauthorized.setdefault(anthropic_shape, reply.body) == reply.body, (path, reply.body)
    assert b"invalid_api_key" in unauthorized[False] and b"authentication_error" in unauthorized[True]
    for key in (MAIN_KEY, *TENANT_KEYS):
        assert main_server.get("/v1/models", key=key).status == 200
        assert main_server.get("/no/such/route", key=key).status == 404
    assert "security" in doc["paths"]["/openapi.json"]["get"]
    assert "security" not in doc["paths"]["/health"]["get"]


def test_sockets_bind_to_loopback_by_default(main_server: Served) -> None:
    assert main_server.backend.startswith("127.0.0.1:")
    assert main_server.host == "127.0.0.1"
    pids = [main_server.proc.pid, *main_server.host_pids()]
    assert len(pids) >= 2
    listening = [c for pid in pids for c in psutil.Process(pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    ports = {c.laddr.port for c in listening}
    assert int(main_server.backend.rsplit(":", 1)[1]) in ports and main_server.port in ports
    assert all(_loopback(c.laddr.ip) for c in listening), listening


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # gRPC listens on ::ffff:127.0.0.1 (still loopback only)
    return (mapped or addr).is_loopback


def test_no_pickle_in_the_source() -> None:
    pattern = re.compile(r"\b(pickle|cPickle|cloudpickle|dill|jsonpickle|shelve|marshal)\b|torch\.load\(|"
                         r"allow_pickle\s*=\s*True|weights_only\s*=\s*False")
    hits = []
    for folder in ("frontend", "backend", "observability", "kernels", "model_repository"):
        for path in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, hits


def test_no_process_unpickles_anything_at_runtime(main_server: Served, pickle_audit_file: Path) -> None:
    loaded = Path(str(pickle_audit_file) + ".loaded").read_text().splitlines()
    pids = {line.split()[0] for line in loaded}
    assert f"pid={main_server.proc.pid}" in pids and len(pids) >= 2, loaded  # the guard runs in gateway and host
    # Traffic on every socket kind: HTTP routes, SSE, gRPC to the host, the host's metrics port.
    main_server.complete(model="tiny", prompt="Once upon a time", max_tokens=4)
    assert main_server.post("/v1/chat/completions", {"model": "tiny", "stream": True, "max_tokens": 3,
                                                     "messages": [{"role": "user", "content": "hi"}]}).status == 200
    assert main_server.post("/tokenize", {"prompt": "hi"}).status == 200
    assert main_server.post("/detokenize", {"tokens": [1, 2]}).status == 200
    assert main_server.get("/metrics").status == 200 and main_server.get("/health").status == 200
    assert pickle_audit_file.read_text() == ""


def test_error_bodies_and_logs_never_leak(main_server: Served) -> None:
    mark = main_server.log_mark()
    bad = [
        ("/v1/completions", {"model": "tiny", "prompt": CANARY, "temperature": 9}),
        ("/v1/completions", {"model": "tiny", "prompt": CANARY, "top_k": 10**6}),  # refused by the engine
        ("/v1/completions", {"model": "tiny", "prompt": CANARY + " x" * 400, "max_tokens": 5}),  # engine: too long
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": CANARY}]}),
        ("/v1/completions", {"model": "nope", "prompt": CANARY}),
        ("/tokenize", {"model": "tiny", "prompt": CANARY, "add_special_tokens": "x"}),
    ]
    for path, body in bad:
        reply = main_server.post(path, body)
        assert 400 <= reply.status < 500, (path, reply.status)
        text = reply.body.decode()
        assert not any(leak in text for leak in LEAKS), text
    raw = main_server.request("POST", "/v1/completions", raw=f'{{"prompt": "{CANARY}", "n": '.encode(),
                              headers={"Content-Type": "application/json"})
    assert raw.status == 400 and CANARY.encode() not in raw.body
    # Rejected by aiohttp's HTTP parser before any handler runs; its exceptions quote the raw
    # request (headers included), so only their type may reach the logs.
    for malformed in (f"Authorization: Bearer {CANARY}\r\nX-Big: {'a' * 9000}\r\n\r\n",
                      f"Transfer-Encoding: chunked\r\nX-Key: {CANARY}\r\n\r\nZZ\r\n{CANARY}\r\n0\r\n\r\n"):
        with socket.create_connection((main_server.host, main_server.port), timeout=10) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{malformed}".encode())
            status_line = sock.recv(64).split(b"\r\n")[0]
            assert status_line.startswith(b"HTTP/1.") and b" 400 " in status_line, status_line
    main_server.complete(model="tiny", prompt=CANARY, max_tokens=3)  # a good request: its prompt stays out too
    logs = "".join(main_server.logs_since(mark))
    assert logs  # the requests were logged (without their prompts)
    for leak in LEAKS:
        assert leak not in logs, (leak, [line for line in logs.splitlines() if leak in line][:3])
