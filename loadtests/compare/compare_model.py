"""The model a comparison runs on: `--model DIR`, or the default benchmark model.

The default is a random-weight Llama made by `kvserve.backend.models.tiny`
with a shape big enough that the forward pass, not Python, dominates a step
on a CPU (hidden 512, 8 layers, GQA 8/2, vocabulary 2048: ~26M parameters),
and small enough that the one-at-a-time baseline finishes in minutes. It is
written once into the cache folder and reused (the writer is idempotent).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

BENCH_SPEC = {"hidden_size": 512, "intermediate_size": 1536, "num_layers": 8, "num_heads": 8,
              "num_kv_heads": 2, "vocab_size": 2048}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1}
# safetensors header dtype names -> torch names
_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8", "U8": "uint8"}


def bench_model_dir() -> Path:
    base = os.environ.get("KVSERVE_CACHE_DIR") or str(Path.home() / ".cache" / "kvserve")
    return Path(base).expanduser() / "bench-512"


def ensure_bench_model(model: str | None) -> str:
    """The model folder to use: the given one (checked), else the default, created if needed."""
    if model:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {model}: not a model folder (no config.json); "
                             "--compare loads models from disk in the Hugging Face layout")
        return str(path)
    from kvserve.backend.models.tiny import TinySpec, make_tiny_model

    return str(make_tiny_model(bench_model_dir(), TinySpec(**BENCH_SPEC)))


def model_config(model_dir: str) -> dict[str, object]:
    return json.loads((Path(model_dir) / "config.json").read_text())


def vocab_size(model_dir: str) -> int:
    return int(model_config(model_dir)["vocab_size"])


def prompt_vocab_size(model_dir: str) -> int:
    """Prompt ids are drawn below this: ids the model and its tokenizer both know.

    A checkpoint may pad its embedding beyond the tokenizer (the tiny models
    do); the model accepts those ids, but an OpenAI server checks prompt ids
    against the tokenizer, as vLLM does, and would reject them with a 400."""
    limit = vocab_size(model_dir)
    tokenizer_file = Path(model_dir) / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        limit = min(limit, Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True))
    return limit


def weight_tensors(model_dir: str) -> dict[str, tuple[int, str]]:
    """name -> (element count, stored dtype) from the safetensors headers, without loading weights."""
    out: dict[str, tuple[int, str]] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for d in info["shape"]:
                count *= int(d)
            out[name] = (count, _ST_DTYPES.get(info["dtype"], "float32"))
    return out


def model_facts(model_dir: str, dtype: str) -> dict[str, object]:
    """Parameter count and weight bytes at the dtype the run uses ("auto": as stored)."""
    tensors = weight_tensors(model_dir)
    params = sum(n for n, _ in tensors.values())
    nbytes = sum(n * _DTYPE_BYTES.get(dtype if dtype != "auto" else stored, 4) for n, stored in tensors.values())
    embed = sum(n for name, (n, _) in tensors.items() if name.endswith("embed_tokens.weight"))
    cfg = model_config(model_dir)
    return {"path": model_dir, "architectures": cfg.get("architectures"), "num_parameters": params,
            "weight_bytes": nbytes, "embedding_parameters": embed, "vocab_size": cfg.get("vocab_size"),
            "hidden_size": cfg.get("hidden_size"), "num_layers": cfg.get("num_hidden_layers"),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False))}
