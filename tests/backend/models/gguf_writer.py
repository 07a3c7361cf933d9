"""Small random GGUF checkpoints of a Llama-shaped model, written with the `gguf` package's writer.

Every weight matrix is stored in the quantization type under test (norms stay
F32, as llama.cpp writes them). `gguf` quantizes the legacy types itself; it has
no quantizer for the K-quants, so their blocks are random bytes with the
block's float16 scale fields set to small values (any bytes are a valid block;
random scales could be inf or NaN). Rows are 256 wide: the K-quants' block.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Byte offsets of the float16 scale fields inside one 256-element K-quant block (ggml's block layouts).
_K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


@dataclass(frozen=True, slots=True)
class GGUFSpec:
    hidden: int = 256
    ffn: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 320
    context: int = 256


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-character table: every byte is a token, so any text tokenizes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def quantized_blocks(array: np.ndarray, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    """`array` [N, K] as GGUF blocks of `kind` (uint8 [N, bytes per row]) and the gguf type (None for F32)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize
    qtype = GGMLQuantizationType[kind]
    if kind == "F32":
        return array, None
    if kind not in _K_SCALE_OFFSETS:
        return quantize(array, qtype), qtype
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = array.shape
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.004).tobytes(), dtype=np.uint8)
    for offset in _K_SCALE_OFFSETS[kind]:
        data[:, :, offset:offset + 2] = scale
    return data.reshape(rows, cols // block * size), qtype


def write_random_gguf(path: Path, kind: str, spec: GGUFSpec = GGUFSpec(), seed: int = 0) -> Path:
    from gguf import GGUFWriter
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(spec.layers)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.hidden)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(spec.vocab)
    writer.add_rope_dimension_count(spec.hidden // spec.heads)
    tokens = _byte_tokens() + [f"<extra_{i}>" for i in range(spec.vocab - 256)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * spec.vocab)
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    head_dim = spec.hidden // spec.heads
    shapes = {"token_embd.weight": (spec.vocab, spec.hidden), "output.weight": (spec.vocab, spec.hidden)}
    for i in range(spec.layers):
        shapes |= {f"blk.{i}.attn_q.weight": (spec.heads * head_dim, spec.hidden),
                   f"blk.{i}.attn_k.weight": (spec.kv_heads * head_dim, spec.hidden),
                   f"blk.{i}.attn_v.weight": (spec.kv_heads * head_dim, spec.hidden),
                   f"blk.{i}.attn_output.weight": (spec.hidden, spec.heads * head_dim),
                   f"blk.{i}.ffn_gate.weight": (spec.ffn, spec.hidden),
                   f"blk.{i}.ffn_up.weight": (spec.ffn, spec.hidden),
                   f"blk.{i}.ffn_down.weight": (spec.hidden, spec.ffn)}
    for name, shape in shapes.items():
        weights = (rng.standard_normal(shape) * 0.08).astype(np.float32)
        data, qtype = quantized_blocks(weights, kind, rng)
        if qtype is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(spec.layers)
                                      for n in ("attn_norm", "ffn_norm")]
    for name in norms:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(spec.hidden)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
