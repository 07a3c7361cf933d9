"""How an encoder's hidden states become one vector per input: read from the
sentence-transformers files of the folder (modules.json, the Pooling module's
config.json), and applied to the packed batch.

A folder without sentence-transformers files is pooled as vLLM pools a plain
BERT checkpoint: the [CLS] token, L2-normalised.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

POOLING_MODES = ("mean", "cls", "last")
_ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_ST = "sentence_transformers.models."


@dataclass(slots=True, frozen=True)
class PoolingSpec:
    mode: str          # one of POOLING_MODES
    normalize: bool    # the folder's default; a request may override it
    dimension: int
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: `dimensions` is refused

    @classmethod
    def from_model_dir(cls, model_dir: Path, hidden_size: int) -> PoolingSpec:
        model_cfg = _read_json(model_dir / "config.json", {})
        matryoshka = _matryoshka(model_cfg, hidden_size)
        modules = _read_json(model_dir / "modules.json", default=None)
        if modules is None:
            return cls("cls", True, hidden_size, matryoshka)
        types = [str(m.get("type", "")) for m in modules]
        unknown = [t for t in types if t not in (_ST + "Transformer", _ST + "Pooling", _ST + "Normalize")]
        if unknown:
            raise ValueError(f"model: sentence-transformers module {unknown[0]} is not supported "
                             "(Transformer, Pooling and Normalize are)")
        pooling = next((m for m in modules if m.get("type") == _ST + "Pooling"), None)
        mode = "cls"
        if pooling is not None:
            mode = _pooling_mode(_read_json(model_dir / str(pooling.get("path", "")) / "config.json", {}))
        return cls(mode, (_ST + "Normalize") in types, hidden_size, matryoshka)


def _read_json(path: Path, default):
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"model: {path} is not valid JSON ({exc})") from None


def _pooling_mode(cfg: dict) -> str:
    for key in _ST_UNSUPPORTED:
        if cfg.get(key):
            raise ValueError(f"model: pooling {key} is not supported (mean, cls and lasttoken are)")
    chosen = [mode for key, mode in _ST_MODES.items() if cfg.get(key)]
    if len(chosen) != 1:
        raise ValueError("model: the Pooling module must choose exactly one of mean, cls and lasttoken")
    return chosen[0]


def _matryoshka(model_cfg: dict, hidden_size: int) -> tuple[int, ...] | None:
    """Dimensions the model was trained to be truncated to (vLLM reads the same keys)."""
    dims = model_cfg.get("matryoshka_dimensions")
    if isinstance(dims, list) and dims and all(isinstance(d, int) and 0 < d <= hidden_size for d in dims):
        return tuple(sorted(set(dims)))
    if model_cfg.get("is_matryoshka") is True:
        return tuple(range(1, hidden_size + 1))
    return None


def pool(hidden: torch.Tensor, seq_lens: list[int], starts: torch.Tensor, segment: torch.Tensor,
         mode: str) -> torch.Tensor:
    """[T, H] packed hidden states -> [B, H] in float32. Mean pooling counts every
    token of an input, [CLS] and [SEP] included, as sentence-transformers does."""
    hidden = hidden.float()
    if mode == "cls":
        return hidden[starts]
    lens = torch.tensor(seq_lens, dtype=torch.long, device=hidden.device)
    if mode == "last":
        return hidden[starts + lens - 1]
    sums = hidden.new_zeros(len(seq_lens), hidden.shape[1]).index_add_(0, segment, hidden)
    return sums / lens.unsqueeze(1).to(hidden.dtype)


def finish(vectors: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka truncation first, then L2 normalisation (of the truncated vector)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return F.normalize(vectors, p=2, dim=-1) if normalize else vectors
