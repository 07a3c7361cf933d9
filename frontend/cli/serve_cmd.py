"""`kvserve serve`: one command that serves a model over the OpenAI API.

Without --triton-url it starts the embedded Triton-compatible host as a child
process (the engine lives there), waits for its ready line, then runs the
gateway in this process; with --triton-url the gateway talks to running
tritonserver(s) or hosts instead, balancing between them.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import kvserve.frontend
from kvserve.frontend.backend_client import (BackendClient, TritonBackendClient, TritonEmbeddingClient,
                                             add_replica_flags, build_backend, is_dns_url, is_remote,
                                             positive_number, validate_replica_flags)
from kvserve.frontend.cli.commands import package_version
from kvserve.frontend.cli.default_model import DEFAULT_MODEL_NAME, gateway_model_dir, looks_like_path, resolve_model
from kvserve.frontend.cli.engine_flags import ENGINE_FLAGS, add_engine_flags, engine_env, parse_bytes
from kvserve.frontend.cli.headless import add_node_flags, check_node_flags, run_headless
from kvserve.frontend.cli.host_process import HostProcess, HostStartError, host_command
from kvserve.frontend.cli.model_info import derive_max_model_len
from kvserve.frontend.http import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY,
                                   DEFAULT_MAX_STREAM_BUFFER, DEFAULT_SHUTDOWN_TIMEOUT_S, DEFAULT_WRITE_TIMEOUT_S,
                                   Gateway, GatewayConfig, add_cors_flags, add_host_flags, build_app,
                                   cors_policy_from_args, drain_gateway, host_policy_from_args, load_api_keys,
                                   load_secret, start_app)
from kvserve.frontend.openai import TOOL_PARSERS, ToolSettings, resolve_template_arg
from kvserve.seam.tokenizer import ModelTokenizer

log = logging.getLogger("kvserve.frontend.serve")

# Flags the gateway itself uses even when the engine runs elsewhere.
_GATEWAY_SIDE = {"served_model_name", "tokenizer", "max_model_len", "chat_template", "log_format",
                 "log_requests", "otlp_traces_endpoint", "block_size",  # block_size: the prefix-affinity key
                 "enable_lora", "allow_runtime_lora_updating"}  # LoRA: which names and routes the gateway takes
_LORA_FLAGS = ("lora_modules", "max_loras", "max_cpu_loras", "max_lora_rank", "allow_runtime_lora_updating")


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvserve serve", description="Serve a model with an OpenAI-compatible API.")
    p.add_argument("model_tag", nargs="?", help="the model (same as --model, like `vllm serve MODEL`)")
    p.add_argument("--model", help="a Hugging Face model folder, a .gguf file, or a known model's name "
                                   f"(fetched once into the cache; default: {DEFAULT_MODEL_NAME}; "
                                   "kvserve-tiny: a small random model for tests)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: pick a free one)")
    p.add_argument("--api-key", action="append", default=None,
                   help="require `Authorization: Bearer KEY` on every route but /health, /metrics, /version; "
                        "repeat for several keys (tenant 'default'; default: $KVSERVE_API_KEY)")
    p.add_argument("--api-keys-file", metavar="FILE",
                   help="more API keys, one 'KEY TENANT' per line; tenants never share prefix-cache entries")
    p.add_argument("--cache-salt-secret-file", metavar="FILE", default=None,
                   help="secret keying the tenants' prefix-cache salts, shared by a deployment's gateways; "
                        "generated there once when absent ($KVSERVE_CACHE_SALT_SECRET wins; default "
                        "$XDG_STATE_HOME/kvserve/cache-salt-secret)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="SECONDS",
                   help="on SIGTERM, in-flight requests get this long to finish before they end with an error "
                        f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:.0f})")
    p.add_argument("--triton-url", action="append", default=[], metavar="HOST:PORT",
                   help="use running Triton server(s) over gRPC instead of starting the embedded host; repeat to "
                        "balance; dns://NAME:PORT balances over every address NAME resolves to")
    p.add_argument("--triton-metrics-url", action="append", default=[], metavar="URL",
                   help="metrics URL of each --triton-url, same order (default: http://HOST:<grpc port + 1>/metrics)")
    p.add_argument("--triton-model-name", default="llm", help="model name in the Triton repository")
    p.add_argument("--embedding-model", metavar="DIR|NAME",
                   help="also serve /v1/embeddings with this embedding model (a BERT-family Hugging Face folder, "
                        "or a known name: all-MiniLM-L6-v2), beside the chat model; served under this name")
    p.add_argument("--embedding-served-model-name", metavar="NAME",
                   help="the name clients call the embedding model by (default: --embedding-model as given)")
    p.add_argument("--triton-embedding-model-name", default="embed",
                   help="the embedding model's name in the Triton repository")
    p.add_argument("--model-repository", help="Triton model repository for the embedded host")
    p.add_argument("--max-request-body-bytes", type=parse_bytes, default=DEFAULT_MAX_BODY,
                   help="larger bodies get 413 (default 4MiB)")
    p.add_argument("--header-timeout", type=positive_number, default=DEFAULT_HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="a connection must send a request's complete head within this of opening (or of its "
                        "previous response), else it is closed; idle keep-alive connections close after it too "
                        f"(default {DEFAULT_HEADER_TIMEOUT_S:g})")
    p.add_argument("--body-timeout", type=positive_number, default=DEFAULT_BODY_TIMEOUT_S, metavar="SECONDS",
                   help=f"a request body must arrive within this, else 408 (default {DEFAULT_BODY_TIMEOUT_S:g})")
    p.add_argument("--max-stream-buffer-bytes", type=parse_bytes, default=DEFAULT_MAX_STREAM_BUFFER,
                   help="output a streaming client leaves unread beyond this cancels its request and drops the "
                        "connection (default 8MiB)")
    p.add_argument("--write-timeout", type=positive_number, default=DEFAULT_WRITE_TIMEOUT_S, metavar="SECONDS",
                   help="a streaming client that reads nothing for this long has its request cancelled (its KV "
                        f"blocks freed) and the connection dropped (default {DEFAULT_WRITE_TIMEOUT_S:g})")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the embedded host")
    p.add_argument("--server-dev-mode", action="store_true", default=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
                   help="mount POST /reset_prefix_cache, as vLLM does with VLLM_SERVER_DEV_MODE=1 (which sets "
                        "this flag too): any client with a key can then empty the prefix cache")
    tools = p.add_argument_group("tool calling (same names as vLLM)")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='allow tool_choice "auto": the model decides, --tool-call-parser reads its calls')
    tools.add_argument("--tool-call-parser", choices=TOOL_PARSERS,
                       help="how tool calls are read out of the model's text (hermes: <tool_call>{json}</tool_call>)")
    responses = p.add_argument_group("the Responses API's store (previous_response_id, GET /v1/responses/{id})")
    responses.add_argument("--disable-response-store", action="store_true",
                           help="keep no /v1/responses answers: store is false for every response")
    responses.add_argument("--response-store-size", type=int, default=1024, metavar="N",
                           help="answers kept (per server, least recently used dropped first; each API key "
                                "sees only its own)")
    add_engine_flags(p)
    add_node_flags(p)
    add_replica_flags(p)
    add_cors_flags(p)
    add_host_flags(p)
    return p


@dataclass(slots=True)
class Plan:
    model: str | None          # --model as given: a path, a known model's name, or None for the default
    local: bool                # the model (or the default) is loaded or fetched here
    tokenizer_dir: Path | None
    served_names: list[str]
    remote: bool
    embedding_model: str | None = None  # --embedding-model as given
    embedding_name: str | None = None   # what clients call it


def plan_from_args(args: argparse.Namespace) -> Plan:
    if args.model and args.model_tag and args.model != args.model_tag:
        raise UsageError("give the model once: either positionally or with --model")
    model = args.model or args.model_tag
    remote = is_remote(args)
    if remote:
        validate_replica_flags(args)
    missing = model is not None and looks_like_path(model) and not Path(model).expanduser().exists()
    if missing and not remote:
        raise UsageError(f"--model {model}: no such file or folder (kvserve loads models from disk, "
                         "or fetches a known model by its name)")
    local = not remote or (model is not None and not missing)  # remote: a missing path only names the model
    tokenizer_dir = Path(args.tokenizer).expanduser() if args.tokenizer else None
    if remote and tokenizer_dir is None and not local:
        raise UsageError("--triton-url needs the model's tokenizer for chat templates and /tokenize: "
                         "pass --model (a folder, a .gguf file or a known name) or --tokenizer DIR")
    if args.served_model_name:
        names = list(args.served_model_name)
    elif model:
        names = [model]
    else:
        names = [args.triton_model_name if remote else DEFAULT_MODEL_NAME]
    if remote:
        ignored = [f.flag for f in ENGINE_FLAGS if f.field not in _GATEWAY_SIDE and getattr(args, f.field) is not None]
        if ignored:
            log.warning("engine flags %s are ignored with --triton-url (set them on the Triton side)", " ".join(ignored))
    embedding = args.embedding_model
    if embedding is not None:
        if looks_like_path(embedding) and not Path(embedding).expanduser().is_dir() and not remote:
            raise UsageError(f"--embedding-model {embedding}: no such folder (a Hugging Face folder of a "
                             "BERT-family model, or a known name such as all-MiniLM-L6-v2)")
        embedding_name = args.embedding_served_model_name or embedding
        if embedding_name in names:
            raise UsageError("--embedding-model: the embedding model needs a name of its own "
                             "(the chat model is served under the same one)")
        if remote and (not args.triton_url or is_dns_url(args.triton_url[0])):
            raise UsageError("--embedding-model with --triton-url needs a HOST:PORT first --triton-url "
                             "(embeddings go to that server's embed model)")
    check_lora_flags(args, names, remote)
    return Plan(model, local, tokenizer_dir, names, remote, embedding,
                args.embedding_served_model_name or embedding)


def check_lora_flags(args: argparse.Namespace, names: list[str], remote: bool) -> None:
    """LoRA flags that cannot work, refused before anything starts (each message names its flag)."""
    if not args.enable_lora:
        given = [f"--{f.replace('_', '-')}" for f in _LORA_FLAGS if getattr(args, f) not in (None, False, [])]
        if given:
            raise UsageError(f"{' '.join(given)}: needs --enable-lora")
        return
    seen: set[str] = set()
    for module in args.lora_modules or []:
        name, path = module["name"], module["path"]
        if name in seen:
            raise UsageError(f"--lora-modules: adapter {name!r} is given twice")
        if name in names:
            raise UsageError(f"--lora-modules: adapter {name!r} has the base model's served name")
        seen.add(name)
        if not remote:
            folder = Path(path).expanduser()
            if not folder.is_dir():
                raise UsageError(f"--lora-modules {name}={path}: no such folder (a PEFT adapter folder: "
                                 "adapter_config.json + adapter_model.safetensors)")
            module["path"] = str(folder.resolve())  # the host may not share our working directory
    if args.max_cpu_loras is not None and args.max_loras is not None and args.max_cpu_loras < args.max_loras:
        raise UsageError(f"--max-cpu-loras ({args.max_cpu_loras}) must be >= --max-loras ({args.max_loras})")


def model_repository(args: argparse.Namespace) -> str:
    if args.model_repository:
        return str(Path(args.model_repository).resolve())
    return str(Path(kvserve.frontend.__file__).resolve().parent.parent / "model_repository")


def start_host(args: argparse.Namespace, model_path: Path, served_name: str,
               embedding: tuple[Path, str] | None = None,
               ) -> tuple[HostProcess, TritonBackendClient, TritonEmbeddingClient | None]:
    # The engine names the model in its spans (gen_ai.request.model) as clients call it.
    env = {"KVSERVE_SERVED_MODEL_NAME": served_name, **os.environ, **engine_env(args),
           "KVSERVE_MODEL": str(model_path.resolve()), "PYTHONUNBUFFERED": "1"}
    models = [args.triton_model_name]
    if embedding is not None:
        models.append(args.triton_embedding_model_name)
        env.update(KVSERVE_EMBED_MODEL=str(embedding[0].resolve()), KVSERVE_EMBED_SERVED_MODEL_NAME=embedding[1])
    # Port 0: the host binds free ports itself and names them in its ready line. Ports picked here
    # and bound there seconds later (after the model loads) could be taken in between.
    host = HostProcess(host_command(model_repository(args), 0, 0, models), env)
    address = host.start(args.startup_timeout)
    client = TritonBackendClient(address.grpc, model_name=args.triton_model_name,
                                 metrics_url=f"http://{address.metrics}/metrics")
    embedder = (TritonEmbeddingClient(address.grpc, model_name=args.triton_embedding_model_name)
                if embedding is not None else None)
    return host, client, embedder


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


async def run_gateway(gateway: Gateway, host: str, port: int, child: HostProcess | None) -> int:
    app = build_app(gateway)
    runner, bound = await start_app(app, host, port)
    # What start-up made lives as long as the process: frozen, Python's full collections no longer
    # walk it between the streamed tokens (the engine's process does the same: backend/triton/triton_model.py).
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    stop, force = asyncio.Event(), asyncio.Event()
    exit_code = 0

    def on_signal() -> None:  # the second signal skips the rest of the drain
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    print(f"kvserve gateway ready http://{host}:{bound} model={gateway.default_model} "
          f"backend={gateway.backend.name}", flush=True)
    if not await gateway.backend.ready():
        log.warning("the backend is not ready yet; /health answers 503 until it is")
    learner = asyncio.create_task(gateway.learn_model_facts_when_ready(), name="kvserve-model-facts")
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            if child is not None and not child.alive():
                log.error("the embedded host exited; stopping")
                exit_code = 1
                break
    log.info("shutting down")
    await drain_gateway(gateway, gateway.config.shutdown_timeout, force,
                backend_alive=lambda: child is None or child.alive())
    learner.cancel()
    await runner.cleanup()  # cancels what is left, which cancels their Triton requests
    return exit_code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kvserve.observability.logging import configure_logging
    from kvserve.observability.tracing import setup_tracing

    configure_logging(fmt=args.log_format, log_requests=args.log_requests)
    if args.headless:
        return run_headless(args)  # another node of a multi-node world: its ranks, no API
    try:
        problem = check_node_flags(args)
        if problem:
            raise UsageError(problem)
        plan = plan_from_args(args)
        if args.enable_auto_tool_choice and not args.tool_call_parser:
            raise UsageError("--enable-auto-tool-choice needs --tool-call-parser")
        chat_template = resolve_template_arg(args.chat_template)
        api_keys = load_api_keys(args.api_key or [os.environ.get("KVSERVE_API_KEY", "")], args.api_keys_file)
        salt_secret = load_secret(args.cache_salt_secret_file)
        setup_tracing(args.otlp_traces_endpoint, service_name="kvserve-gateway")
    except (UsageError, OSError, ValueError) as exc:
        print(f"kvserve serve: error: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_exit)  # clean up the child if stopped while starting
    child: HostProcess | None = None
    try:
        backend: BackendClient
        model_path = resolve_model(plan.model) if plan.local else None
        # The folder of Hugging Face files the gateway reads (a GGUF's are exported from it once).
        model_dir = gateway_model_dir(model_path) if model_path is not None else None
        embedding_path = None
        if plan.embedding_model is not None and (not plan.remote or Path(plan.embedding_model).expanduser().is_dir()):
            embedding_path = resolve_model(plan.embedding_model)  # a folder, or a known name fetched here
        embedder: TritonEmbeddingClient | None = None
        if not plan.remote:
            embedding = (embedding_path, plan.embedding_name) if embedding_path is not None else None
            child, backend, embedder = start_host(args, model_path, plan.served_names[0], embedding)
        elif plan.embedding_model is not None:
            embedder = TritonEmbeddingClient(args.triton_url[0], model_name=args.triton_embedding_model_name)
        tokenizer_dir = plan.tokenizer_dir or model_dir
        tokenizer = ModelTokenizer.from_folder(tokenizer_dir) if tokenizer_dir else None
        if plan.remote:
            backend = build_backend(args, tokenizer)  # the tokenizer keys prefix affinity
        config = GatewayConfig(
            served_model_names=plan.served_names,
            model_root=str(model_path) if model_path else None,
            api_keys=api_keys,
            cache_salt_secret=salt_secret,
            max_request_body_bytes=args.max_request_body_bytes,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_stream_buffer_bytes=args.max_stream_buffer_bytes,
            write_timeout=args.write_timeout,
            # Derived from the model folder only when this process starts the engine:
            # a remote server may run with another --max-model-len.
            # (Unknown in front of remote backends without the flag: the gateway asks them.)
            max_model_len=args.max_model_len if plan.remote else derive_max_model_len(model_dir, args.max_model_len),
            learn_served_name=plan.remote and not args.served_model_name,
            # In front of remote backends without --enable-lora: learned from them (describe).
            enable_lora=True if args.enable_lora else (None if plan.remote else False),
            allow_runtime_lora_updating=bool(args.allow_runtime_lora_updating),
            server_dev_mode=bool(args.server_dev_mode),
            chat_template=chat_template,
            log_requests=bool(args.log_requests),
            cors=cors_policy_from_args(args),
            hosts=host_policy_from_args(args),
            version=package_version(),
            shutdown_timeout=args.shutdown_timeout,
            tools=ToolSettings(auto=args.enable_auto_tool_choice, parser=args.tool_call_parser),
            response_store_entries=0 if args.disable_response_store else max(0, args.response_store_size),
            embedding_model_names=[plan.embedding_name] if plan.embedding_name else [],
            embedding_model_root=str(embedding_path) if embedding_path else None,
            embedding_max_model_len=derive_max_model_len(embedding_path, None),
        )
        signal.signal(signal.SIGTERM, previous)  # from here the event loop handles it
        gateway = Gateway(config, backend, tokenizer, embedder=embedder)
        return asyncio.run(run_gateway(gateway, args.host, args.port, child))
    except (HostStartError, RuntimeError, OSError) as exc:
        print(f"kvserve serve: error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        if child is not None:
            child.stop()


if __name__ == "__main__":
    sys.exit(main())
