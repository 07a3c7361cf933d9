"""Read a GGUF checkpoint (llama.cpp's single-file format) as the Llama-family loader needs it.

Two things come out of a GGUF file: the hyper-parameters, as the same dict a
Hugging Face config.json would hold (so ArchConfig reads both alike), and the
tensors, dequantized to float32 with the `gguf` package's own dequantization and
renamed to Hugging Face's names. No torch here: the gateway's metadata export
(gguf_tokenizer.py) runs this module too.

llama.cpp's converter reorders the rows of q_proj and k_proj for the Llama
architecture (its rotary kernel pairs dimensions i and i+1; Hugging Face's pairs
i and i+d/2). Within each head, HF rows [0..d/2) + [d/2..d) became interleaved:

    HF    head h:  x0 x1 ... x(d/2-1) | y0 y1 ... y(d/2-1)
    GGUF  head h:  x0 y0 x1 y1 ... x(d/2-1) y(d/2-1)

`_unpermute` undoes that, so the model's rotary stays the HF one.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kvserve.backend.models.gguf_codes import BlockCodes, block_codes

# GGUF architecture -> (HF architecture name, whether q/k rows were permuted by the converter)
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
    "gemma3": ("Gemma3ForCausalLM", False),
}
# Gemma 3's norms: its converter stores the RMSNorm multiplier 1 + w; transformers takes 1 back off.
_GEMMA3_LAYER_TENSORS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}

# Quantization types whose dequantization this loader is tested with (tests/backend/models/test_gguf_types.py).
SUPPORTED_TENSOR_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")


def is_gguf(path: str | Path) -> bool:
    return gguf_file(path) is not None


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a --model value names: the file itself, or the only *.gguf in a folder
    that holds no Hugging Face checkpoint."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix == ".gguf" else None
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    files = sorted(p.glob("*.gguf"))
    if len(files) > 1:
        raise ValueError(f"model: {p} holds {len(files)} GGUF files; name one of them")
    return files[0] if files else None


def open_gguf(path: str | Path):
    """A reader over the memory-mapped file. Parsing the metadata takes seconds (its vocabulary
    arrays are read element by element), and the engine needs it three times at start (its
    hyper-parameters, its tensors, its tokenizer): one reader per unchanged file serves them all."""
    p = Path(path).resolve()
    stat = p.stat()
    return _open_gguf(str(p), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _open_gguf(path: str, _mtime_ns: int, _size: int):
    from gguf import GGUFReader  # numpy-only; imported late so HF-folder loads never need it
    try:
        return GGUFReader(path, "r")
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ValueError(f"model: {Path(path).name} is not a readable GGUF file ({type(exc).__name__})") from None


def field_value(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def hf_config(reader) -> dict[str, Any]:
    """The model's hyper-parameters from GGUF metadata, as a Hugging Face config.json dict."""
    arch = field_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"model: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    hf_arch, _ = GGUF_ARCHITECTURES[arch]

    def meta(key: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = meta("vocab_size") or len(field_value(reader, "tokenizer.ggml.tokens", []) or []) \
        or int(_tensor(reader, "token_embd.weight").shape[-1])
    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(meta("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(meta("context_length", 2048)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "torch_dtype": "float32",
    }
    scaling = meta("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ValueError(f"model: GGUF rope scaling {scaling!r} is not supported (supported: linear)")
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor", 1.0))}
    if "rope_freqs.weight" in names:
        raise ValueError("model: GGUF rope_freqs (Llama 3.1-style rope scaling) is not supported")
    if arch == "gemma3":
        config.update(_gemma3_config(meta, config))
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        value = field_value(reader, name)
        if value is not None:
            config[key] = int(value)
    return config


def _gemma3_config(meta, config: dict[str, Any]) -> dict[str, Any]:
    """What transformers' GGUF loader fills in for gemma3 beyond the common keys."""
    from kvserve.backend.models.arch_config import FULL, SLIDING, gemma3_layer_types
    return {
        "layer_types": gemma3_layer_types(config["num_hidden_layers"]),
        "sliding_window": int(meta("attention.sliding_window")),
        # The GGUF keeps one theta, the full layers'; the sliding layers' is Gemma 3's fixed 10,000.
        "rope_parameters": {FULL: {"rope_type": "default", "rope_theta": config["rope_theta"]},
                            SLIDING: {"rope_type": "default", "rope_theta": 10000.0}},
        # transformers' Gemma3TextConfig default (= head_dim for every size but the 27B).
        "query_pre_attn_scalar": 256,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _tensor(reader, name: str):
    for t in reader.tensors:
        if t.name == name:
            return t
    raise ValueError(f"model: GGUF file lacks tensor {name}")


def hf_tensor_name(name: str, arch: str = "llama") -> str | None:
    """Hugging Face's name for a GGUF tensor (None: a tensor the model does not use)."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    match = _LAYER_NAME.fullmatch(name)
    layer_names = {**_LAYER_TENSORS, **_GEMMA3_LAYER_TENSORS} if arch == "gemma3" else _LAYER_TENSORS
    if match and match.group(2) in layer_names:
        return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}"
    raise ValueError(f"model: unexpected tensor {name!r} in GGUF file")


def dequantize(tensor) -> np.ndarray:
    """One GGUF tensor as float32, in numpy (row-major, HF) order."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
    kind = GGMLQuantizationType(tensor.tensor_type).name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise ValueError(f"model: GGUF tensor type {kind} (tensor {tensor.name}) is not supported "
                         f"(supported: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))})")
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions fastest-first
    array = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
    # F32 tensors come back as views of the read-only memory map: copy them out of it.
    return array if array.flags.writeable else array.copy()


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, config: dict[str, Any], with_codes: bool = False,
               ) -> Iterator[tuple[str, np.ndarray, BlockCodes | None]]:
    """(Hugging Face name, float32 array, its block codes) for every tensor the model uses; the codes
    (gguf_codes.py) only `with_codes`, for a block type that has them, else None."""
    from gguf import GGMLQuantizationType
    arch = field_value(reader, "general.architecture")
    permuted = GGUF_ARCHITECTURES[arch][1]
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, arch)
        if name is None:
            continue
        array = dequantize(tensor)
        codes = (block_codes(GGMLQuantizationType(tensor.tensor_type).name, tensor.data, array)
                 if with_codes and name.endswith(("proj.weight", "embed_tokens.weight", "lm_head.weight")) else None)
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array - np.float32(1.0)
        heads = (config["num_attention_heads"] if ".self_attn.q_proj." in name
                 else config["num_key_value_heads"] if ".self_attn.k_proj." in name else None)
        if permuted and heads is not None:
            array = _unpermute(array, heads)
            codes = codes and codes.rows(lambda rows: _unpermute(rows, heads))
        yield name, array, codes
