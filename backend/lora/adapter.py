"""Reading a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) into float32 CPU tensors.

Every problem is a LoRAError naming it: the file, the tensor, the rank, the target. An adapter is
checked against the base model's projection shapes here, once, so nothing later (the slots, the
kernels) meets a tensor of the wrong size. The runtime reads safetensors directly: peft is not needed.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvserve.backend.lora.lora_request import LoRAError, LoRARequest

# The seven projections an adapter may target, by PEFT's (Hugging Face's) module names.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


@dataclass(frozen=True, slots=True)
class TargetShapes:
    """The base model's projections as an adapter sees them: (in_features, out_features) per target."""
    num_layers: int
    shapes: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, arch) -> "TargetShapes":
        """From an ArchConfig (models/arch_config.py)."""
        h, q = arch.hidden_size, arch.num_attention_heads * arch.head_dim
        kv, inter = arch.num_key_value_heads * arch.head_dim, arch.intermediate_size
        return cls(arch.num_hidden_layers, {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                                            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)})


@dataclass(slots=True)
class LoRAAdapter:
    """A checked adapter: per (layer, target), A [r, in] and B [out, r] in float32 on the CPU."""
    request: LoRARequest
    rank: int
    scaling: float  # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    targets: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * 4 + b.numel() * 4 for a, b in self.weights.values())


# Options whose meaning the batched products do not implement: refused rather than ignored.
_UNSUPPORTED = {"use_dora": "DoRA (use_dora)", "modules_to_save": "modules_to_save", "rank_pattern": "rank_pattern",
                "alpha_pattern": "alpha_pattern", "layers_to_transform": "layers_to_transform",
                "fan_in_fan_out": "fan_in_fan_out", "lora_bias": "lora_bias", "target_parameters": "target_parameters",
                "trainable_token_indices": "trainable_token_indices", "use_qalora": "QALoRA (use_qalora)",
                "megatron_config": "megatron_config", "layer_replication": "layer_replication",
                "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "use_bdlora": "use_bdlora",
                "arrow_config": "arrow_config", "layers_pattern": "layers_pattern"}


def _read_config(folder: Path, name: str) -> dict:
    path = folder / CONFIG_FILE
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoRAError(f"adapter {name!r}: {path} does not exist (a PEFT adapter folder holds "
                        f"{CONFIG_FILE} and {WEIGHTS_FILE})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRAError(f"adapter {name!r}: cannot read {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise LoRAError(f"adapter {name!r}: {path} is not a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoRAError(f"adapter {name!r}: peft_type {peft_type} is not supported (only LORA)")
    for key, label in _UNSUPPORTED.items():
        if cfg.get(key):
            raise LoRAError(f"adapter {name!r}: {label} is not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAError(f"adapter {name!r}: bias={cfg['bias']!r} is not supported (only 'none')")
    return cfg


def _config_targets(cfg: dict, name: str, shapes: TargetShapes) -> frozenset[str] | None:
    """The targets adapter_config.json names (None for a regular expression: the tensors decide)."""
    targets = cfg.get("target_modules")
    if targets == "all-linear":
        return frozenset(shapes.shapes)
    if isinstance(targets, str) or targets is None:
        return None
    short = {str(t).rsplit(".", 1)[-1] for t in targets}
    lacking = sorted(short - set(shapes.shapes))
    if lacking:
        raise LoRAError(f"adapter {name!r}: target {lacking[0]!r} is not a module of the model "
                        f"(it has {', '.join(shapes.shapes)})")
    return frozenset(short)


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    if not path.is_file():
        other = sorted(p.name for p in path.parent.glob("adapter_model*"))
        hint = f" (found {', '.join(other)}; only safetensors is read)" if other else ""
        raise LoRAError(f"adapter {name!r}: {path} does not exist{hint}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}
    except Exception as exc:  # safetensors raises its own error types (and OSError) for a bad file
        raise LoRAError(f"adapter {name!r}: {path} is not a readable safetensors file: {exc}") from None


def load_adapter(request: LoRARequest, shapes: TargetShapes, max_rank: int) -> LoRAAdapter:
    """Read and check `request`'s files against the model; a LoRAError names the first problem."""
    name = request.lora_name
    folder = Path(request.lora_path)
    if folder.suffix == ".gguf":
        raise LoRAError(f"adapter {name!r}: GGUF LoRA adapters ({folder.name}) are not supported; "
                        f"give the PEFT folder (adapter_config.json + adapter_model.safetensors)")
    if not folder.is_dir():
        raise LoRAError(f"adapter {name!r}: {folder} is not a folder")
    cfg = _read_config(folder, name)
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise LoRAError(f"adapter {name!r}: r must be a positive integer in {CONFIG_FILE}, got {r!r}")
    if r > max_rank:
        raise LoRAError(f"adapter {name!r}: rank {r} exceeds max_lora_rank {max_rank} (--max-lora-rank)")
    alpha = cfg.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoRAError(f"adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    wanted = _config_targets(cfg, name, shapes)
    tensors = _read_tensors(folder / WEIGHTS_FILE, name)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None or m.group(3) not in _PARENT or _PARENT[m.group(3)] != m.group(2):
            raise LoRAError(f"adapter {name!r}: unexpected tensor {key} (only lora_A/lora_B of "
                            f"{', '.join(TARGETS)} are read)")
        layer, target = int(m.group(1)), m.group(3)
        if layer >= shapes.num_layers:
            raise LoRAError(f"adapter {name!r}: tensor {key} is for layer {layer}; the model has "
                            f"{shapes.num_layers} layers")
        if wanted is not None and target not in wanted:
            raise LoRAError(f"adapter {name!r}: unexpected tensor {key} ({target} is not in target_modules)")
        found.setdefault((layer, target), {})[m.group(4)] = tensor
    targets = wanted if wanted is not None else frozenset(t for _, t in found)
    if not targets:
        raise LoRAError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA tensors")
    weights = {}
    for layer in range(shapes.num_layers):
        for target in sorted(targets, key=TARGETS.index):
            pair = found.get((layer, target), {})
            for side in "AB":
                if side not in pair:
                    raise LoRAError(f"adapter {name!r}: missing tensor base_model.model.model.layers.{layer}."
                                    f"{_PARENT[target]}.{target}.lora_{side}.weight")
            a, b = pair["A"], pair["B"]
            fan_in, fan_out = shapes.shapes[target]
            prefix = f"layers.{layer}.{_PARENT[target]}.{target}"
            if tuple(a.shape) != (r, fan_in):
                raise LoRAError(f"adapter {name!r}: {prefix}.lora_A has shape {tuple(a.shape)}, expected "
                                f"({r}, {fan_in}) (rank {r}, the model's {target} input size)")
            if tuple(b.shape) != (fan_out, r):
                raise LoRAError(f"adapter {name!r}: {prefix}.lora_B has shape {tuple(b.shape)}, expected "
                                f"({fan_out}, {r}) (the model's {target} output size, rank {r})")
            if not (a.is_floating_point() and b.is_floating_point()):
                raise LoRAError(f"adapter {name!r}: {prefix} tensors must be floating point, got {a.dtype}")
            a, b = a.float().contiguous(), b.float().contiguous()
            if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
                raise LoRAError(f"adapter {name!r}: {prefix} holds non-finite values")
            weights[(layer, target)] = (a, b)
    return LoRAAdapter(request, r, float(scaling), frozenset(targets), weights)
