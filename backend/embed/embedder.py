"""An embedding model as the batcher needs it: tokenize and check inputs, and
turn a list of token-id inputs into pooled vectors in one packed forward pass.

No KV cache, no decoding, no scheduler: an input is done in the pass that
runs it. Who runs together is the batcher's business (embed_batcher.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from tokenizers import Tokenizer

from kvserve.backend.models import EncoderConfig, PackedBatch, PoolingSpec, finish, load_encoder, pool
from kvserve.seam.error_wire import ErrorKind, RequestError, invalid
from kvserve.seam.limits import MAX_EMBEDDING_INPUTS

# What an empty `model` parameter of model_repository/embed serves (a wheel fetched into the cache).
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True, frozen=True)
class EmbedderConfig:
    """The embed model's parameters (config.pbtxt names, KVSERVE_EMBED_* overrides)."""

    model: str
    served_model_name: str = "embed"
    dtype: str = "float32"  # fp32 by default: the model is small and cosine parity is the contract
    device: str = "auto"
    max_model_len: int | None = None  # default: the model's max_seq_length, else max_position_embeddings
    max_num_seqs: int = 256           # inputs per forward pass
    max_num_batched_tokens: int = 16384
    max_inputs_per_request: int = MAX_EMBEDDING_INPUTS
    num_threads: int | None = None    # default: torch's (one per core)
    # Passes at once on the CPU, sharing the threads (embed_batcher.py). 1: on the quiet 2-core VM two
    # workers served 0.64x the embeddings/s of one at concurrency 16 (BENCHMARKS §9).
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(_DTYPES)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_inputs_per_request", "num_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len: must be >= 2")

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> EmbedderConfig:
        kinds = {f.name: f.type for f in fields(cls)}
        parsed: dict = {}
        for key, text in values.items():
            if key not in kinds or text == "":
                continue
            kind = str(kinds[key])
            try:
                parsed[key] = int(text) if "int" in kind else text
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {text!r}") from None
        return cls(**parsed)


def model_input_limit(model_dir: Path, max_position_embeddings: int) -> int:
    """The longest input the model is meant to see: sentence-transformers' `max_seq_length`
    (sentence_bert_config.json) where the folder has one, else the position limit.

    all-MiniLM-L6-v2 was trained on 256 tokens though BERT's positions go to 512; an input
    between the two gives a vector the reference library never gives (it cuts at 256). Like
    vLLM, kvserve takes the 256 and refuses longer inputs with a 400 naming it, unless the
    request's truncate_prompt_tokens cuts them (then the vector equals sentence-transformers')."""
    try:
        config = json.loads((model_dir / "sentence_bert_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return max_position_embeddings
    seq = config.get("max_seq_length") if isinstance(config, dict) else None
    if isinstance(seq, int) and not isinstance(seq, bool) and 2 <= seq < max_position_embeddings:
        return seq
    return max_position_embeddings


class Embedder:
    def __init__(self, config: EmbedderConfig) -> None:
        self.config = config
        model_dir = Path(config.model)
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.arch = EncoderConfig.from_model_dir(model_dir)
        self.pooling = PoolingSpec.from_model_dir(model_dir, self.arch.hidden_size)
        self.model = load_encoder(model_dir, _DTYPES[config.dtype], self.device)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"model: no tokenizer.json in {model_dir}")
        self._tok = Tokenizer.from_file(str(path))
        # The folder's tokenizer.json may pad and truncate (MiniLM's: to 128); limits are ours to apply.
        self._tok.no_padding()
        self._tok.no_truncation()
        self._specials = self._tok.num_special_tokens_to_add(False)
        self.vocab_size = self._tok.get_vocab_size()
        limit = model_input_limit(model_dir, self.arch.max_position_embeddings)
        self.max_model_len = min(limit, config.max_model_len) if config.max_model_len else limit
        if config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens: {config.max_num_batched_tokens} is below the longest "
                             f"input ({self.max_model_len} tokens)")

    @property
    def dimension(self) -> int:
        return self.pooling.dimension

    # ---- inputs ----------------------------------------------------------------------------
    def tokenize(self, texts: list[str], truncate: int | None) -> list[list[int]]:
        """Texts -> token ids with the model's special tokens ([CLS] ... [SEP]). With
        `truncate`, the text is cut so that the whole input has at most that many
        tokens, special ones included (sentence-transformers cuts the same way)."""
        # encode_batch runs in parallel and without the GIL: other threads keep going.
        encodings = self._tok.encode_batch(texts, add_special_tokens=truncate is None)
        if truncate is None:
            return [e.ids for e in encodings]
        out = []
        for e in encodings:
            e.truncate(max(0, truncate - self._specials))
            out.append(self._tok.post_process(e, None, add_special_tokens=True).ids)
        return out

    def check(self, inputs: list[list[int]], truncate: int | None) -> list[list[int]]:
        """Token-id inputs as the model will run them; a RequestError names the field.

        Ids are taken as given (no special tokens added), as vLLM does."""
        checked = []
        for i, ids in enumerate(inputs):
            if truncate is not None and len(ids) > truncate:
                ids = ids[:truncate]
            if not ids:
                raise invalid("input", f"input {i} is empty")
            if len(ids) > self.max_model_len:
                raise RequestError(f"input {i} has {len(ids)} tokens, over this model's maximum of "
                                   f"{self.max_model_len}; pass truncate_prompt_tokens to cut it", "input",
                                   ErrorKind.CONTEXT_LENGTH)
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise invalid("input", f"input {i} holds a token id outside the vocabulary (0..{self.vocab_size - 1})")
            checked.append(ids)
        return checked

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        allowed = self.pooling.matryoshka_dimensions
        if allowed is None:
            raise invalid("dimensions", "this model does not support Matryoshka representations; changing its "
                                        "output dimensions would give poor embeddings")
        if dimensions not in allowed:
            raise invalid("dimensions", f"must be one of {list(allowed)}")

    # ---- the forward pass ------------------------------------------------------------------
    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        """Pooled, not yet normalised vectors [len(inputs), dimension], float32 on the CPU."""
        batch = PackedBatch.build(inputs, self.device)
        hidden = self.model(batch)
        return pool(hidden, batch.seq_lens, batch.starts, batch.segment, self.pooling.mode).cpu()

    def finish(self, vectors: torch.Tensor, dimensions: int | None, normalize: bool | None) -> torch.Tensor:
        return finish(vectors, dimensions, self.pooling.normalize if normalize is None else normalize)
