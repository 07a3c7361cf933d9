"""Load a checkpoint into LlamaForCausalLM or Gemma3ForCausalLM: a Hugging Face folder (config.json +
*.safetensors) or one GGUF file (gguf_checkpoint.py renames and dequantizes it).

Only local files: no hub access. q/k/v and gate/up checkpoint tensors are
spliced into the fused projections of the model.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from kvserve.backend.models import gguf_checkpoint
from kvserve.backend.models.arch_config import ArchConfig
from kvserve.backend.models.gemma3 import Gemma3ForCausalLM
from kvserve.backend.models.gguf_codes import BlockCodes, fuse
from kvserve.backend.models.llama import LlamaForCausalLM

_FUSED = {
    "self_attn.q_proj": ("qkv_proj", 0), "self_attn.k_proj": ("qkv_proj", 1),
    "self_attn.v_proj": ("qkv_proj", 2), "mlp.gate_proj": ("gate_up_proj", 0),
    "mlp.up_proj": ("gate_up_proj", 1),
}
_RENAMED = {
    "self_attn.o_proj.weight": "o_proj.weight", "mlp.down_proj.weight": "down_proj.weight",
    "input_layernorm.weight": "input_layernorm", "post_attention_layernorm.weight": "post_attention_layernorm",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    # Gemma 3's two extra norms around the MLP.
    "pre_feedforward_layernorm.weight": "pre_feedforward_layernorm",
    "post_feedforward_layernorm.weight": "post_feedforward_layernorm",
}


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    return files


def _shard_slices(model: LlamaForCausalLM, fused: str) -> list[tuple[int, int]]:
    layer = model.layers[0]
    if fused == "qkv_proj":
        sizes = [layer.q_size, layer.kv_size, layer.kv_size]
    else:
        sizes = [layer.gate_up_proj.out_features // 2] * 2
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def _target(model: LlamaForCausalLM, name: str) -> tuple[torch.Tensor, slice | None] | None:
    """The parameter (and row slice for fused ones) a checkpoint tensor goes into."""
    name = name.removeprefix("model.")
    if name == "embed_tokens.weight":  # a pipeline stage holds it, the norm and lm_head only where it runs them
        return None if model.embed_tokens is None else (model.embed_tokens.weight, None)
    if name == "norm.weight":
        return None if model.norm is None else (model.norm, None)
    if name == "lm_head.weight":
        return (None if model.lm_head is None else (model.lm_head, None))
    if not name.startswith("layers."):
        return None
    _, idx, rest = name.split(".", 2)
    local = int(idx) - getattr(model, "first_layer", 0)
    if not 0 <= local < len(model.layers):  # another pipeline stage's layer
        return None
    layer = model.layers[local]
    for prefix, (fused, shard) in _FUSED.items():
        if rest.startswith(prefix + "."):
            start, end = _shard_slices(model, fused)[shard]
            param = getattr(layer, fused).weight if rest.endswith("weight") else getattr(layer, fused).bias
            return param, slice(start, end)
    if rest in _RENAMED:
        attr = _RENAMED[rest]
        obj = layer
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj, None
    if rest.startswith("self_attn.rotary_emb"):
        return None
    raise ValueError(f"model: unexpected tensor {name!r} in checkpoint")


def _fully_loaded(model: LlamaForCausalLM, name: str, param: torch.Tensor,
                  loaded: set[tuple[int, int | None]]) -> bool:
    for fused in ("qkv_proj", "gate_up_proj"):
        if f".{fused}." in name:
            return all((id(param), start) in loaded for start, _ in _shard_slices(model, fused))
    return (id(param), None) in loaded


def _safetensors_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _gguf_tensors(reader, config: dict, with_codes: bool) -> Iterator[tuple[str, torch.Tensor, BlockCodes | None]]:
    for name, array, codes in gguf_checkpoint.hf_tensors(reader, config, with_codes):
        yield name, torch.from_numpy(array), codes


def load_arch_config(model: str | Path) -> ArchConfig:
    gguf = gguf_checkpoint.gguf_file(model)
    if gguf is None:
        return ArchConfig.from_model_dir(model)
    return ArchConfig.from_dict(gguf_checkpoint.hf_config(gguf_checkpoint.open_gguf(gguf)))


def load_model(model_path: str | Path, dtype: torch.dtype, device: torch.device, max_position: int,
               block_codes: dict[str, BlockCodes] | None = None, shard=None,
               group=None, stage=None) -> tuple[LlamaForCausalLM, ArchConfig]:
    """The model and its config. `block_codes`, when given, is filled with the GGUF blocks' codes of
    the weights that have them (gguf_codes.py), by parameter name, for cpu_linear.pack_linears.
    `shard` and `group` (worker/parallel/): this tensor-parallel rank's part only, cut as read
    (`shard.cut`), and the collectives its model calls. `stage` (worker/parallel/stage_plan.py): this
    pipeline stage's layers only (and the embedding, norm and logits where it runs them); the
    checkpoint's other tensors are read one at a time and dropped."""
    gguf = gguf_checkpoint.gguf_file(model_path)
    if gguf is None:
        cfg = ArchConfig.from_model_dir(model_path)
        tensors = ((name, tensor, None) for name, tensor in _safetensors_tensors(Path(model_path)))
    else:
        reader = gguf_checkpoint.open_gguf(gguf)
        config = gguf_checkpoint.hf_config(reader)
        cfg = ArchConfig.from_dict(config)
        tensors = _gguf_tensors(reader, config, with_codes=block_codes is not None)
    with torch.device("meta"):
        if shard is None and stage is None:
            model = (Gemma3ForCausalLM if cfg.is_gemma3 else LlamaForCausalLM)(cfg, max_position)
        else:  # worker/parallel/plan.py and stage_plan.py refused Gemma 3 already
            model = LlamaForCausalLM(cfg, max_position, shard, group, stage)
    model = model.to_empty(device=device)
    loaded: set[tuple[int, int | None]] = set()
    names = {id(p): n for n, p in model.named_parameters()}
    code_parts: dict[str, dict[int, BlockCodes]] = {}
    with torch.no_grad():
        for name, tensor, codes in tensors:
            target = _target(model, name)
            if target is None:
                continue
            param, rows = target
            if shard is not None:
                tensor, codes = shard.cut(name, tensor, codes, cfg)
            if codes is not None:
                code_parts.setdefault(names[id(param)], {})[0 if rows is None else rows.start] = codes
            dest = param if rows is None else param[rows]
            if dest.shape != tensor.shape:
                raise ValueError(f"model: tensor {name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(dest.shape)}")
            dest.copy_(tensor)
            loaded.add((id(param), None if rows is None else rows.start))
    missing = [n for n, p in model.named_parameters() if not _fully_loaded(model, n, p, loaded)]
    if missing:
        raise ValueError(f"model: checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
    if block_codes is not None:
        # A fused weight has codes only if every part has (a part of another type keeps its floats).
        params = dict(model.named_parameters())
        for name, parts in code_parts.items():
            if sum(p.codes.shape[0] for p in parts.values()) == params[name].shape[0]:
                block_codes[name] = fuse([parts[start] for start in sorted(parts)])
    if hasattr(model, "finalize_weights"):
        model.finalize_weights()
    model = model.to(dtype)
    model.build_rotary(device)
    return model.eval(), cfg
