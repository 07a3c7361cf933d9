"""The engine flags `kvserve serve` accepts, as data: vLLM's names, so users
migrating from `vllm serve` keep their command lines.

Each flag whose `export` is true travels to the embedded host as an
environment variable `KVSERVE_<FIELD>` (field = the flag in snake case, the
`EngineConfig` field name), which model.py reads on top of config.pbtxt. Flags
left unset are not exported, so the engine's defaults apply.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from kvserve.seam.limits import MAX_LORA_NAME_CHARS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_bytes(text: str) -> int:
    """`--kv-cache-memory 8589934592`, `8GiB`, `8G` or `8GB`: every suffix is a power
    of 1024, the way GPU memory is counted (no K-vs-Ki surprise)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 8589934592, 8GiB, 512MiB)")
    value = float(match.group(1)) * 1024 ** _POWERS[match.group(2).lower()]
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return int(value)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def json_object(text: str) -> dict:
    """`--speculative-config '{"method": "ngram", ...}'`: a JSON object; its keys and values are
    the engine's to check at start (the gateway knows no engine field)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError("must be in (0, 1]")
    return value


def lora_module(text: str) -> dict:
    """`--lora-modules name=path`, or vLLM's JSON form '{"name": ..., "path": ..., "base_model_name": ...}'."""
    text = text.strip()
    if text.startswith("{"):
        value = json_object(text)
        if not isinstance(value.get("name"), str) or not isinstance(value.get("path"), str):
            raise argparse.ArgumentTypeError("the JSON form needs string \"name\" and \"path\"")
        unknown = set(value) - {"name", "path", "base_model_name"}
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown key(s) {sorted(unknown)} (name, path, base_model_name)")
        if value.get("base_model_name") is not None and not isinstance(value["base_model_name"], str):
            raise argparse.ArgumentTypeError("base_model_name must be a string")
    else:
        name, sep, path = text.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected NAME=PATH or a JSON object, got {text!r}")
        value = {"name": name.strip(), "path": path.strip()}
    if not value["name"] or value["name"].strip() != value["name"] or len(value["name"]) > MAX_LORA_NAME_CHARS:
        raise argparse.ArgumentTypeError(f"an adapter name must be 1-{MAX_LORA_NAME_CHARS} characters without "
                                         "surrounding spaces")
    if not value["path"]:
        raise argparse.ArgumentTypeError(f"adapter {value['name']!r} has no path")
    return {k: value[k] for k in ("name", "path", "base_model_name") if value.get(k) is not None}


@dataclass(slots=True, frozen=True)
class EngineFlag:
    flag: str
    help: str
    type: Callable[[str], Any] | None = str  # None: a boolean --x/--no-x flag
    choices: tuple[str, ...] | None = None
    export: bool = True  # passed to the engine as KVSERVE_<FIELD>
    nargs: str | None = None
    repeat: bool = False  # the flag may be given several times; the values add up (a list)

    @property
    def field(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return "KVSERVE_" + self.field.upper()


ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("--served-model-name", "name(s) clients use in `model`; the first is reported", nargs="+"),
    EngineFlag("--tokenizer", "tokenizer folder when it is not the model folder"),
    EngineFlag("--dtype", "weight and activation dtype", choices=("auto", "float32", "float16", "bfloat16")),
    EngineFlag("--max-model-len", "longest prompt + output in tokens (default: the model's)", positive_int),
    EngineFlag("--max-num-seqs", "most sequences in one batch", positive_int),
    EngineFlag("--max-num-batched-tokens", "token budget of one scheduler step", positive_int),
    EngineFlag("--block-size", "tokens per KV cache block (a power of two <= 128)", positive_int),
    EngineFlag("--enable-prefix-caching", "share full KV blocks between requests with a common prefix", None),
    EngineFlag("--scheduling-policy", "fcfs: requests in arrival order; priority: by each request's `priority` "
               "(lower first, then arrival), the least urgent preempted first", choices=("fcfs", "priority")),
    EngineFlag("--gpu-memory-utilization", "fraction of GPU memory the engine may use (CUDA)", fraction),
    EngineFlag("--kv-cache-memory", "KV cache size in bytes (8GiB, 512MiB, ...); skips memory profiling", parse_bytes),
    EngineFlag("--num-kv-blocks", "KV cache size in blocks (overrides --kv-cache-memory)", positive_int),
    EngineFlag("--kv-cache-dtype", "KV cache dtype; auto: the model's; fp8 (= fp8_e4m3) and fp8_e5m2 keep one "
               "byte per value (4x float32's tokens in the same memory), per-tensor scale 1.0, clamped to range",
               choices=("auto", "float32", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    EngineFlag("--stream-interval", "new tokens per streamed response (first and last never wait); "
               "more means less serving work per token under load", positive_int),
    EngineFlag("--cpu-reserved-cores", "CPU cores the engine's threads leave to the gateway, its transport and "
               "the OS (as vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU); 0: the engine uses every core", non_negative_int),
    EngineFlag("--speculative-config", "speculative decoding, as vLLM's JSON object: "
               "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}' "
               "(docs/serving-flags.md); off when unset", json_object),
    # Tensor parallelism (issue 31, docs/parallelism.md): vLLM's names.
    EngineFlag("--tensor-parallel-size", "ranks that split every layer (Megatron-LM's scheme); must divide the "
               "model's attention heads; 1: one process", positive_int),
    EngineFlag("--pipeline-parallel-size", "pipeline stages of contiguous layers; must divide the model's layers; "
               "the ranks are TP x PP", positive_int),
    EngineFlag("--distributed-executor-backend", "how the ranks run: mp, worker processes (the default); ray, "
               "Ray actors on the cluster ray.init finds (pip install 'kvserve[ray]')", choices=("mp", "ray")),
    # Ranks on several machines (vLLM's mp-backend names): node 0 serves, the others run --headless.
    EngineFlag("--nnodes", "machines the ranks run on (mp backend); node 0 runs the engine and the API, "
               "each other node `kvserve serve --headless --node-rank K` (docs/parallelism.md)", positive_int),
    EngineFlag("--node-rank", "this machine's node in [0, --nnodes); only 0 serves (the others: --headless)",
               non_negative_int),
    EngineFlag("--master-addr", "the head node's address, as the other nodes reach it (the TCP rendezvous)"),
    EngineFlag("--master-port", "the TCP rendezvous's port on the head (default 29501 with --nnodes > 1)",
               positive_int),
    EngineFlag("--seed", "engine seed for requests without their own", int),
    EngineFlag("--attention-backend", "attention implementation", choices=("auto", "triton", "torch")),
    EngineFlag("--enforce-eager", "CUDA: run decode steps eagerly instead of replaying CUDA graphs captured at "
               "start-up", None),
    EngineFlag("--quantization", "weight-only quantization of the linear layers (CPU): int8 per channel, "
               "int4 in groups of 32", choices=("none", "int8", "int4")),
    EngineFlag("--max-waiting-requests", "queue limit; beyond it requests get 503", non_negative_int),
    EngineFlag("--otlp-traces-endpoint", "OTLP endpoint for traces (gateway and engine)"),
    EngineFlag("--log-format", "log line format (gateway and engine)", choices=("json", "console")),
    EngineFlag("--log-requests", "one log line per request; prompts and outputs reach the logs only with this flag", None),
    EngineFlag("--chat-template", "chat template: a file or the Jinja text (gateway only)", export=False),
    # LoRA (issue 33, docs/lora.md): vLLM's names; lora_modules and allow_runtime_lora_updating are
    # the Triton model's parameters (backend/triton/lora_adapters.py), the others EngineConfig fields.
    EngineFlag("--enable-lora", "serve LoRA adapters over the base model (a request picks one by `model`)", None),
    EngineFlag("--lora-modules", "adapters served from the start: NAME=PATH (a PEFT folder) or the JSON form "
               "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; several, or repeat the flag",
               lora_module, nargs="+", repeat=True),
    EngineFlag("--max-loras", "LoRA adapters resident at once (and at most this many in one batch)", positive_int),
    EngineFlag("--max-cpu-loras", "LoRA adapters kept loaded in CPU memory (default: --max-loras)", positive_int),
    EngineFlag("--max-lora-rank", "the largest LoRA rank accepted; bigger adapters are refused", positive_int),
    EngineFlag("--allow-runtime-lora-updating", "mount POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
               "(they need the API key when one is set); off by default", None),
)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (same names as vLLM)")
    for f in ENGINE_FLAGS:
        kwargs: dict[str, Any] = {"dest": f.field, "default": None, "help": f.help}
        if f.type is None:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = f.type
            if f.choices:
                kwargs["choices"] = f.choices
            if f.nargs:
                kwargs["nargs"] = f.nargs
            if f.repeat:
                kwargs["action"] = "extend"
        group.add_argument(f.flag, **kwargs)


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)  # --speculative-config: the engine parses it back
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], dict):
            return json.dumps(list(value))  # --lora-modules: a JSON list, as the model's lora_modules
        return str(value[0])  # --served-model-name: the engine reports the first name
    return str(value)


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    """KVSERVE_<FIELD> for every exported flag the user set."""
    env: dict[str, str] = {}
    for f in ENGINE_FLAGS:
        value = getattr(args, f.field, None)
        if f.export and value is not None:
            env[f.env] = _env_value(value)
    return env
