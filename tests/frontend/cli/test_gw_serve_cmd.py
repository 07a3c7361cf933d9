"""`kvserve serve`: flags, engine environment, the host child process, and the
whole gateway process against a fake Triton server over real gRPC."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import grpc
import openai
import pytest
from tritonclient.grpc import service_pb2_grpc

from kvserve.frontend.cli.engine_flags import ENGINE_FLAGS, engine_env, parse_bytes
from kvserve.frontend.cli.host_process import HostProcess, HostStartError
from kvserve.frontend.cli.serve_cmd import UsageError, build_parser, model_repository, plan_from_args

from gw_fakes import get
from gw_triton_fakes import FakeTriton

REPO = Path(__file__).resolve().parents[3]


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_engine_flags_become_kvserve_env_vars() -> None:
    args = parse("--max-num-seqs", "8", "--no-enable-prefix-caching", "--kv-cache-memory", "2GiB", "--dtype", "bfloat16",
                 "--gpu-memory-utilization", "0.5", "--served-model-name", "a", "b", "--log-requests",
                 "--chat-template", "{{ x }}", "--cpu-reserved-cores", "1")
    env = engine_env(args)
    assert env == {
        "KVSERVE_MAX_NUM_SEQS": "8", "KVSERVE_ENABLE_PREFIX_CACHING": "false", "KVSERVE_KV_CACHE_MEMORY": str(2 << 30),
        "KVSERVE_DTYPE": "bfloat16", "KVSERVE_GPU_MEMORY_UTILIZATION": "0.5", "KVSERVE_SERVED_MODEL_NAME": "a",
        "KVSERVE_LOG_REQUESTS": "true", "KVSERVE_CPU_RESERVED_CORES": "1",
    }
    assert engine_env(parse()) == {}  # unset flags leave the engine's defaults alone
    assert {f.env for f in ENGINE_FLAGS} >= {"KVSERVE_MAX_MODEL_LEN", "KVSERVE_BLOCK_SIZE", "KVSERVE_SEED",
                                             "KVSERVE_ATTENTION_BACKEND", "KVSERVE_MAX_WAITING_REQUESTS",
                                             "KVSERVE_MAX_NUM_BATCHED_TOKENS", "KVSERVE_KV_CACHE_DTYPE"}


def test_the_engine_learns_the_name_clients_use(monkeypatch, tmp_path: Path) -> None:
    # Its spans carry gen_ai.request.model: the served name, not Triton's model name ("llm").
    from kvserve.frontend.cli import serve_cmd  # noqa: PLC0415
    from kvserve.frontend.cli.host_process import HostAddress  # noqa: PLC0415

    seen: list[dict[str, str]] = []

    class Recorder:
        def __init__(self, command: list[str], env: dict[str, str]) -> None:
            seen.append(env)

        def start(self, timeout_s: float) -> HostAddress:
            return HostAddress(grpc="127.0.0.1:1", metrics="127.0.0.1:2")

    monkeypatch.setattr(serve_cmd, "HostProcess", Recorder)
    monkeypatch.delenv("KVSERVE_SERVED_MODEL_NAME", raising=False)
    serve_cmd.start_host(parse(), tmp_path, "kvserve-tiny")
    serve_cmd.start_host(parse("--served-model-name", "mine"), tmp_path, "mine")
    monkeypatch.setenv("KVSERVE_SERVED_MODEL_NAME", "from-env")  # the user's own setting wins
    serve_cmd.start_host(parse(), tmp_path, "kvserve-tiny")
    assert [env["KVSERVE_SERVED_MODEL_NAME"] for env in seen] == ["kvserve-tiny", "mine", "from-env"]


def test_flag_values_are_checked() -> None:
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("1073741824") == 1 << 30 and parse_bytes("1.5k") == 1536
    for argv in (["--max-num-seqs", "0"], ["--gpu-memory-utilization", "1.5"], ["--kv-cache-memory", "lots"],
                 ["--attention-backend", "cuda"], ["--cpu-reserved-cores", "-1"]):
        with pytest.raises(SystemExit):
            parse(*argv)


def test_plan(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--tokenizer"):
        plan_from_args(parse("--triton-url", "h:8001"))
    with pytest.raises(UsageError, match="no such file or folder"):
        plan_from_args(parse("--model", str(tmp_path / "missing")))
    plan = plan_from_args(parse(str(tmp_path)))  # positional, like `vllm serve MODEL`
    assert plan.model == str(tmp_path) and plan.local and plan.served_names == [str(tmp_path)] and not plan.remote
    plan = plan_from_args(parse("--triton-url", "h:8001", "--tokenizer", str(tmp_path), "--served-model-name", "m"))
    assert plan.remote and not plan.local and plan.tokenizer_dir == tmp_path and plan.served_names == ["m"]
    # A remote model named by a path that is not here only names it; a known name is fetched for its tokenizer.
    plan = plan_from_args(parse("--triton-url", "h:8001", "--model", "/models/x", "--tokenizer", str(tmp_path)))
    assert not plan.local and plan.served_names == ["/models/x"]
    assert plan_from_args(parse("--triton-url", "h:8001", "--model", "SmolLM2-135M-Instruct")).local
    assert plan_from_args(parse()).served_names == ["SmolLM2-135M-Instruct"] and plan_from_args(parse()).local
    assert Path(model_repository(parse())) == REPO / "model_repository"


def test_embedding_model_plan_and_host(monkeypatch, tmp_path: Path) -> None:
    from kvserve.frontend.cli import serve_cmd  # noqa: PLC0415
    from kvserve.frontend.cli.host_process import HostAddress  # noqa: PLC0415

    with pytest.raises(UsageError, match="--embedding-model .*no such folder"):
        plan_from_args(parse("--embedding-model", str(tmp_path / "missing")))
    with pytest.raises(UsageError, match="a name of its own"):
        plan_from_args(parse("--served-model-name", "same", "--embedding-model", str(tmp_path),
                             "--embedding-served-model-name", "same"))
    with pytest.raises(UsageError, match="HOST:PORT first --triton-url"):
        plan_from_args(parse("--triton-url", "dns://t:8001", "--tokenizer", str(tmp_path),
                             "--embedding-model", "all-MiniLM-L6-v2"))
    plan = plan_from_args(parse("--embedding-model", "all-MiniLM-L6-v2"))  # a known name, beside the default chat model
    assert plan.embedding_name == "all-MiniLM-L6-v2" and plan.served_names == ["SmolLM2-135M-Instruct"]
    assert plan_from_args(parse("--embedding-model", str(tmp_path), "--embedding-served-model-name", "e")).embedding_name == "e"

    seen: list[tuple[list[str], dict[str, str]]] = []

    class Recorder:
        def __init__(self, command: list[str], env: dict[str, str]) -> None:
            seen.append((command, env))

        def start(self, timeout_s: float) -> HostAddress:
            return HostAddress(grpc="127.0.0.1:1", metrics="127.0.0.1:2")

    monkeypatch.setattr(serve_cmd, "HostProcess", Recorder)
    _, _, embedder = serve_cmd.start_host(parse(), tmp_path, "chat")
    assert embedder is None
    _, _, embedder = serve_cmd.start_host(parse(), tmp_path, "chat", (tmp_path, "e"))
    assert embedder is not None
    (plain, _), (both, env) = seen
    loads = lambda cmd: [cmd[i + 1] for i, a in enumerate(cmd) if a == "--load-model"]  # noqa: E731
    assert loads(plain) == ["llm"] and loads(both) == ["llm", "embed"] and "explicit" in both
    assert env["KVSERVE_EMBED_MODEL"] == str(tmp_path.resolve()) and env["KVSERVE_EMBED_SERVED_MODEL_NAME"] == "e"


FAKE_HOST = textwrap.dedent("""
    import sys, time, signal
    print("loading the model", flush=True)
    if sys.argv[1] == "die":
        sys.exit(3)
    print("kvserve-host ready grpc=127.0.0.1:1234 metrics=127.0.0.1:1235", flush=True)
    print("after ready", flush=True)
    time.sleep(60)
""")


def test_host_process_waits_for_ready_line_and_stops(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(FAKE_HOST)
    host = HostProcess([sys.executable, str(script), "ok"], dict(os.environ))
    address = host.start(timeout_s=10)
    assert (address.grpc, address.metrics) == ("127.0.0.1:1234", "127.0.0.1:1235")
    assert host.alive()
    assert host.stop(grace_s=5) == -signal.SIGTERM
    with pytest.raises(HostStartError, match="code 3"):
        HostProcess([sys.executable, str(script), "die"], dict(os.environ)).start(timeout_s=10)


class _FakeTritonThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> int:
        self.thread.start()

        async def start() -> int:
            self.server = grpc.aio.server()
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeTriton(), self.server)
            port = self.server.add_insecure_port("127.0.0.1:0")
            await self.server.start()
            return port

        return asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_serve_process_against_remote_triton(tokenizer_dir: Path) -> None:
    with _FakeTritonThread() as grpc_port:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvserve.frontend.cli", "serve", "--triton-url", f"127.0.0.1:{grpc_port}",
             "--tokenizer", str(tokenizer_dir), "--served-model-name", "remote", "--port", "0", "--api-key", "k",
             "--log-format", "console"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            line = proc.stdout.readline()
            assert line.startswith("kvserve gateway ready http://127.0.0.1:"), line + proc.stderr.read()
            url = line.split()[3]
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=10)
            out = client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "hi"}])
            assert out.choices[0].message.content == "Hello" and out.choices[0].finish_reason == "stop"
            assert out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 3
            assert out.usage.prompt_tokens_details.cached_tokens == 2
            chunks = list(client.completions.create(model="remote", prompt="ok", stream=True))
            assert "".join(c.choices[0].text for c in chunks) == "Hello"
            assert get(f"{url}/health").status == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0


def test_version_flag_prints_the_version_get_version_reports(capsys) -> None:
    from kvserve.frontend.cli.commands import main, package_version
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == package_version()
    assert main(["-v"]) == 0 and capsys.readouterr().out.strip() == package_version()
    assert main(["--nope"]) == 2 and "unknown command" in capsys.readouterr().err
