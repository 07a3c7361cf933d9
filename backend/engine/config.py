"""Engine configuration: one dataclass whose field names are the vLLM flags in snake case.

The same names are `kvserve serve` flags, `LLM(...)` keyword arguments and
`config.pbtxt` parameters, so a user migrating from `vllm serve` finds them where
they expect them.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.backend.spec_decode import parse_speculative_config

_DTYPES = ("auto", "float32", "float16", "bfloat16")
# auto: the model's dtype. fp8 is vLLM's name for fp8_e4m3; both fp8 formats store one byte per
# value with a per-tensor scale of 1.0, clamped to the format's range (kernels/kv_quant.py).
KV_CACHE_DTYPES = (*_DTYPES, "fp8", "fp8_e4m3", "fp8_e5m2")
_ATTENTION_BACKENDS = ("auto", "torch", "triton")
_QUANTIZATION = ("none", "int8", "int4")  # = models/quantize.py's modes (that module needs torch)
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(slots=True, frozen=True)
class DebugConfig:
    """The engine's test hooks, all off by default. As strings they are set by their own names,
    like any engine argument (KVSERVE_FAULT_INJECTION_STEP, a config.pbtxt parameter), and in
    Python as `EngineConfig(debug=DebugConfig(...))` or `LLM(..., debug=DebugConfig(...))`."""
    # Raise inside the model forward at this step, once (reliability tests).
    fault_injection_step: int | None = None
    # Log when each request is first scheduled and when it is aborted or failed (reliability
    # tests prove from it that a request dropped while queued never ran).
    log_scheduling: bool = False


@dataclass(slots=True)
class EngineConfig:
    model: str = ""
    served_model_name: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    # KV budget: an explicit block count wins, then bytes, then the GPU utilisation fraction on CUDA
    # or a share of the RAM available after the weights on the CPU (kv_cache/kv_budget.py).
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_waiting_requests: int | None = None
    enable_prefix_caching: bool = True
    # vLLM's --scheduling-policy: "fcfs" serves requests in arrival order; "priority" by each
    # request's `priority` (lower first, then arrival), and preempts the least urgent first.
    scheduling_policy: str = "fcfs"
    # Streamed responses carry up to this many new tokens each (vLLM's --stream-interval):
    # 1 sends every token at once; more means fewer responses for the serving path to carry.
    # A choice's first token and its last are never held back.
    stream_interval: int = 1
    attention_backend: str = "auto"
    # CUDA only: decode steps replay CUDA graphs captured at start-up unless this is set
    # (vLLM's --enforce-eager); see backend/worker/cuda_graphs.py. CPU runs are eager regardless.
    enforce_eager: bool = False
    # Weight-only quantization of the linear layers on CPU (models/quantize.py): int8 per
    # channel or int4 in groups of 32; activations run in bfloat16 through those layers.
    quantization: str = "none"
    seed: int = 0
    num_threads: int | None = None  # CPU threads for the engine's torch ops; None: torch's default
    # CPU cores the engine leaves to the serving path and the OS (vLLM's
    # VLLM_CPU_NUM_OF_RESERVED_CPU); see backend/worker/cpu_threads.py.
    cpu_reserved_cores: int = 0
    # vLLM's --speculative-config, a JSON object such as {"method": "ngram", "num_speculative_tokens":
    # 4, "prompt_lookup_max": 4}; None: no speculation (spec_decode/spec_config.py checks it).
    speculative_config: dict[str, Any] | None = None
    # LoRA adapters (backend/lora/, vLLM's names): adapters resident on the device at once (and so
    # the most distinct adapters in one step), the largest rank taken, and how many loaded adapters
    # the CPU keeps (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Tensor parallelism (backend/worker/parallel/, vLLM's names): ranks that split each layer's
    # heads and MLP and the vocabulary (Megatron-LM's scheme); 1 is the single-process engine.
    # Pipeline parallelism: stages of contiguous layers, each of tensor_parallel_size ranks (the
    # world is their product; whether they divide the model is checked at start, against its
    # config). distributed_executor_backend: "mp" (worker processes, local or on --headless nodes;
    # None picks it) or "ray" (Ray actors in a placement group; the ray extra).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    # Ranks on several machines (vLLM's mp-backend names; docs/parallelism.md): the engine runs on node
    # 0 and holds the rendezvous on master_port (None: 29501 with nnodes > 1, a free port otherwise);
    # node k > 0 runs `kvserve serve --headless --node-rank k`, which starts its ranks and joins.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    # Test hooks, apart so that no serving knob is mistaken for one (and none is a `kvserve serve` flag).
    debug: DebugConfig = field(default_factory=DebugConfig)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: a model directory is required")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {_DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.attention_backend not in _ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend: must be one of {_ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.quantization not in _QUANTIZATION:
            raise ValueError(f"quantization: must be one of {_QUANTIZATION}, got {self.quantization!r}")
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"block_size: must be a power of two in [1, 128], got {self.block_size}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy: must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("stream_interval", self.stream_interval)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.num_threads is not None:
            _positive("num_threads", self.num_threads)
        if not isinstance(self.cpu_reserved_cores, int) or self.cpu_reserved_cores < 0:
            raise ValueError(f"cpu_reserved_cores: must be an integer >= 0, got {self.cpu_reserved_cores!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError("num_kv_blocks: need at least 2 (block 0 is the reserved null block)")
        if self.kv_cache_memory is not None:
            _positive("kv_cache_memory", self.kv_cache_memory)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization: must be in (0, 1]")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 0:
            raise ValueError("max_waiting_requests: must be >= 0")
        _positive("max_loras", self.max_loras)
        _positive("max_lora_rank", self.max_lora_rank)
        if self.max_cpu_loras is not None:
            _positive("max_cpu_loras", self.max_cpu_loras)
            if self.max_cpu_loras < self.max_loras:
                raise ValueError(f"max_cpu_loras: must be >= max_loras ({self.max_loras}), got {self.max_cpu_loras}")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _positive("pipeline_parallel_size", self.pipeline_parallel_size)
        _check_executor_backend(self.distributed_executor_backend)
        if self.distributed_executor_backend == "ray" and self.tensor_parallel_size * self.pipeline_parallel_size == 1:
            raise ValueError("distributed_executor_backend: 'ray' places worker ranks, and a world of one rank has "
                             "none (tensor_parallel_size x pipeline_parallel_size is 1): leave it unset")
        _check_nodes(self)
        # Refuses a bad config, naming its field; a string (config.pbtxt, environment) becomes the object.
        if parse_speculative_config(self.speculative_config) is None:
            self.speculative_config = None
        elif isinstance(self.speculative_config, str):
            self.speculative_config = json.loads(self.speculative_config)
        path = Path(self.model)
        if not path.is_dir() and not (path.is_file() and path.suffix == ".gguf"):
            raise ValueError(f"model: {self.model!r} is neither a model folder nor a .gguf file")

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name

    @classmethod
    def field_names(cls) -> list[str]:
        """The engine arguments proper: every field but the debug section."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "debug"]

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every name `from_strings` takes: the engine arguments, then the test hooks."""
        return cls.field_names() + [f.name for f in dataclasses.fields(DebugConfig)]

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> "EngineConfig":
        """Build from string values (config.pbtxt parameters, environment variables)."""
        def parsed(fields: tuple[dataclasses.Field, ...]) -> dict[str, Any]:
            return {f.name: _parse_value(f.name, str(f.type), values[f.name]) for f in fields if f.name in values}

        kwargs = parsed(tuple(f for f in dataclasses.fields(cls) if f.name != "debug"))
        return cls(**kwargs, debug=DebugConfig(**parsed(dataclasses.fields(DebugConfig))))


def _check_executor_backend(name: str | None) -> None:
    if name in (None, "mp"):
        return
    if name == "ray":
        if importlib.util.find_spec("ray") is None:  # found, not imported: ray takes seconds to import
            raise ValueError("distributed_executor_backend: 'ray' needs the ray package, which is not "
                             "installed (pip install 'kvserve[ray]'); or use 'mp' (local worker processes)")
        return
    raise ValueError(f"distributed_executor_backend: must be 'mp' or 'ray', got {name!r}")


def _check_nodes(cfg: "EngineConfig") -> None:
    _positive("nnodes", cfg.nnodes)
    world = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
    if cfg.nnodes > world:
        raise ValueError(f"nnodes: {cfg.nnodes} nodes for a world of {world} rank(s) (tensor_parallel_size x "
                         f"pipeline_parallel_size): every node needs at least one rank")
    if not isinstance(cfg.node_rank, int) or not 0 <= cfg.node_rank < cfg.nnodes:
        raise ValueError(f"node_rank: must be in [0, nnodes={cfg.nnodes}), got {cfg.node_rank!r}")
    if cfg.node_rank != 0:
        raise ValueError(f"node_rank: the engine runs on node 0; node {cfg.node_rank} runs "
                         f"`kvserve serve --headless --node-rank {cfg.node_rank}` (it starts that node's ranks)")
    if not cfg.master_addr:
        raise ValueError("master_addr: an address is required (the head node's, as the other nodes reach it)")
    if cfg.master_port is not None and not (isinstance(cfg.master_port, int) and 0 < cfg.master_port < 65536):
        raise ValueError(f"master_port: must be a TCP port in [1, 65535], got {cfg.master_port!r}")
    if cfg.nnodes > 1 and cfg.distributed_executor_backend == "ray":
        raise ValueError("nnodes: the ray backend places ranks on the cluster's nodes itself; "
                         "nnodes > 1 is for the mp backend")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _parse_value(name: str, type_name: str, raw: str) -> Any:
    text = raw.strip()
    if "None" in type_name and text.lower() in ("", "none", "null"):
        return None
    try:
        if type_name.startswith("bool"):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if type_name.startswith("int"):
            return int(text)
        if type_name.startswith("float"):
            return float(text)
        if type_name.startswith("dict"):
            return json.loads(text)
    except ValueError:
        raise ValueError(f"{name}: cannot parse {raw!r} as {type_name}") from None
    return text


def env_overrides(prefix: str = "KVSERVE_") -> dict[str, str]:
    """Engine arguments from the environment, e.g. KVSERVE_MAX_NUM_SEQS=8."""
    out = {}
    for name in EngineConfig.setting_names():
        key = prefix + name.upper()
        if key in os.environ:
            out[name] = os.environ[key]
    return out
