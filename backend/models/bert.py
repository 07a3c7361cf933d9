"""BERT-family encoder (post-norm, GELU, absolute position and token-type embeddings)
over a packed batch, loaded from a Hugging Face folder with safetensors.

The batch is flat, as in the decoder: the tokens of every input concatenated,
no padding, so the embeddings, every projection, the FFN and the norms (most
of the work for the short texts embeddings usually see) cost exactly the
tokens there are. Only attention needs sequences side by side; it pads per
*group* of inputs of similar length (sorted), never the whole batch to its
longest input:

    packed   [a a a a a | b b | c c c c c c c | d d d]   T rows, one per token
    groups   (b, d) -> [2, 3, ...] padded to 3    (c, a) -> [2, 7, ...] padded to 7
             each group is one scaled_dot_product_attention call with a key mask;
             a group is cut when padding it would waste more than a quarter of it

`PackedBatch` holds the index tensors for those gathers, computed once per
forward pass and shared by all layers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from kvserve.backend.models import cpu_linear
from kvserve.backend.models.cpu_linear import PackedLinear
from kvserve.backend.models.loader import safetensors_files

SUPPORTED_ENCODERS = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification")
_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
# The same activations as oneDNN post-ops of the FFN's first linear: (attr, algorithm) of _linear_pointwise.
_FUSED_ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
                      "relu": ("relu", "")}
# Padding a group of similar-length inputs may cost this fraction of its real tokens, no more.
_MAX_GROUP_WASTE = 0.25


@dataclass(slots=True, frozen=True)
class EncoderConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> EncoderConfig:
        path = model_dir / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"model: cannot read {path} ({exc})") from None
        archs = raw.get("architectures") or [""]
        if raw.get("model_type") != "bert" or archs[0] not in SUPPORTED_ENCODERS:
            raise ValueError(f"model: {archs[0] or raw.get('model_type')!r} is not a supported encoder "
                             f"(BERT family: {', '.join(SUPPORTED_ENCODERS)})")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("model: only absolute position embeddings are supported")
        act = raw.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"model: hidden_act {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        cfg = cls(archs[0], int(raw["vocab_size"]), int(raw["hidden_size"]), int(raw["intermediate_size"]),
                  int(raw["num_hidden_layers"]), int(raw["num_attention_heads"]),
                  int(raw.get("max_position_embeddings", 512)), int(raw.get("type_vocab_size", 2)),
                  float(raw.get("layer_norm_eps", 1e-12)), act)
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError("model: hidden_size is not a multiple of num_attention_heads")
        return cfg


@dataclass(slots=True)
class _Group:
    rows: int          # inputs in the group
    width: int         # the group's longest input
    src: torch.Tensor  # packed row of each real token of the group
    dst: torch.Tensor  # its row in the group's [rows * width] padded layout
    key_mask: torch.Tensor | None  # [rows, 1, 1, width] True where a key is real; None when none is padding
    start: int | None = None  # one input: its first packed row (its rows are a slice, no gather needed)


@dataclass(slots=True)
class PackedBatch:
    """The flat batch: token ids, positions, and each input's [start, end) rows."""

    input_ids: torch.Tensor   # [T] int64
    positions: torch.Tensor   # [T] int64, restarting at 0 for each input
    seq_lens: list[int]
    starts: torch.Tensor      # [B] first row of each input
    segment: torch.Tensor     # [T] which input each row belongs to
    groups: list[_Group]

    @classmethod
    def build(cls, inputs: list[list[int]], device: torch.device) -> PackedBatch:
        if not inputs or any(not ids for ids in inputs):
            raise ValueError("every input needs at least one token")
        lens = [len(ids) for ids in inputs]
        starts = [0]
        for n in lens[:-1]:
            starts.append(starts[-1] + n)
        flat = [t for ids in inputs for t in ids]
        positions = [p for n in lens for p in range(n)]
        segment = [i for i, n in enumerate(lens) for _ in range(n)]
        as_long = dict(dtype=torch.long, device=device)
        return cls(torch.tensor(flat, **as_long), torch.tensor(positions, **as_long), lens,
                   torch.tensor(starts, **as_long), torch.tensor(segment, **as_long),
                   _attention_groups(lens, starts, device))


def _attention_groups(lens: list[int], starts: list[int], device: torch.device) -> list[_Group]:
    order = sorted(range(len(lens)), key=lambda i: lens[i], reverse=True)
    groups, current = [], []
    for i in order:
        # Sorted longest first, the group's width is its first member's length.
        if current:
            width, real = lens[current[0]], sum(lens[j] for j in current) + lens[i]
            if width * (len(current) + 1) > (1 + _MAX_GROUP_WASTE) * real:
                groups.append(current)
                current = []
        current.append(i)
    groups.append(current)
    out = []
    for members in groups:
        width = lens[members[0]]
        src = [starts[i] + p for i in members for p in range(lens[i])]
        dst = [r * width + p for r, i in enumerate(members) for p in range(lens[i])]
        mask = None
        if any(lens[i] != width for i in members):
            mask = torch.tensor([[p < lens[i] for p in range(width)] for i in members], dtype=torch.bool,
                                device=device).view(len(members), 1, 1, width)
        out.append(_Group(len(members), width, torch.tensor(src, dtype=torch.long, device=device),
                          torch.tensor(dst, dtype=torch.long, device=device), mask,
                          starts[members[0]] if len(members) == 1 else None))
    return out


def varlen_attention(qkv: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Bidirectional attention within each input. qkv: [T, 3, heads, head_dim] -> [T, heads * head_dim]."""
    total, _, heads, head_dim = qkv.shape
    out = qkv.new_empty(total, heads * head_dim)
    for g in batch.groups:
        if g.start is not None:  # one input: its own rows, a view (an index gather costs more than SDPA here)
            part = qkv[g.start:g.start + g.width]
        else:
            part = qkv.new_zeros(g.rows * g.width, 3, heads, head_dim)
            part[g.dst] = qkv[g.src]
        q, k, v = part.view(g.rows, g.width, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=g.key_mask)  # [rows, heads, width, head_dim]
        if g.start is not None:
            out[g.start:g.start + g.width].view(g.width, heads, head_dim).copy_(attn[0].transpose(0, 1))
            continue
        attn = attn.transpose(1, 2).reshape(g.rows * g.width, heads * head_dim)
        out[g.src] = attn[g.dst]
    return out


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.head_dim = h // cfg.num_attention_heads
        self.eps = cfg.layer_norm_eps
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.qkv = nn.Linear(h, 3 * h)  # query, key and value fused; the loader splices them
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        qkv = self.qkv(x).view(-1, 3, self.num_heads, self.head_dim)
        x = self.attn_norm(x + self.attn_out(varlen_attention(qkv, batch)))  # post-norm
        return self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))


class PackedActLinear(PackedLinear):
    """`PackedLinear` with the activation applied by oneDNN as it writes the output (one pass less)."""

    def __init__(self, linear: nn.Linear, attr: str, algorithm: str) -> None:
        super().__init__(linear.weight, linear.bias, keep_onednn=True)
        self.attr, self.algorithm = attr, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.attr, [], self.algorithm)


def pack_encoder_linears(model: BertEncoder) -> BertEncoder:
    """float32 on the CPU: every layer's linears as oneDNN `PackedLinear` (cpu_linear.py says why: the
    sgemm of F.linear repacks its weight on every call), the FFN's activation fused into the first one."""
    attr, algorithm = _FUSED_ACTIVATIONS[model.cfg.hidden_act]
    with torch.no_grad():
        for layer in model.layers:
            for name in ("qkv", "attn_out", "ffn_out"):
                linear = getattr(layer, name)
                setattr(layer, name, PackedLinear(linear.weight, linear.bias, keep_onednn=True))
            layer.ffn_in = PackedActLinear(layer.ffn_in, attr, algorithm)
            layer.act = _identity
    return model


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class BertEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))

    @torch.inference_mode()
    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Last hidden states, [T, hidden], in the packed order. Every token is of type 0 (one segment)."""
        x = (self.word_embeddings(batch.input_ids) + self.position_embeddings(batch.positions)
             + self.token_type_embeddings.weight[0])
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, batch)
        return x


_LAYER_NAMES = {
    "attention.self.query": ("qkv", 0), "attention.self.key": ("qkv", 1), "attention.self.value": ("qkv", 2),
    "attention.output.dense": ("attn_out", None), "attention.output.LayerNorm": ("attn_norm", None),
    "intermediate.dense": ("ffn_in", None), "output.dense": ("ffn_out", None),
    "output.LayerNorm": ("ffn_norm", None),
}
_TOP_NAMES = {"embeddings.word_embeddings": "word_embeddings", "embeddings.position_embeddings": "position_embeddings",
              "embeddings.token_type_embeddings": "token_type_embeddings", "embeddings.LayerNorm": "embed_norm"}
_PARAM_NAMES = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}  # old checkpoints: gamma/beta


def _target(model: BertEncoder, name: str) -> tuple[torch.Tensor, slice | None] | None:
    name = name.removeprefix("bert.")
    module_name, _, param = name.rpartition(".")
    if param not in _PARAM_NAMES or module_name.startswith(("pooler", "cls.", "classifier")):
        return None  # the pooler, heads and the position_ids buffer take no part in embeddings
    if module_name in _TOP_NAMES:
        return getattr(getattr(model, _TOP_NAMES[module_name]), _PARAM_NAMES[param]), None
    if not module_name.startswith("encoder.layer."):
        raise ValueError(f"model: unexpected tensor {name!r} in checkpoint")
    idx, _, rest = module_name.removeprefix("encoder.layer.").partition(".")
    if rest not in _LAYER_NAMES:
        raise ValueError(f"model: unexpected tensor {name!r} in checkpoint")
    attr, shard = _LAYER_NAMES[rest]
    tensor = getattr(getattr(model.layers[int(idx)], attr), _PARAM_NAMES[param])
    if shard is None:
        return tensor, None
    size = model.cfg.hidden_size
    return tensor, slice(shard * size, (shard + 1) * size)


def load_encoder(model_dir: str | Path, dtype: torch.dtype, device: torch.device) -> BertEncoder:
    model_dir = Path(model_dir)
    cfg = EncoderConfig.from_model_dir(model_dir)
    with torch.device("meta"):
        model = BertEncoder(cfg)
    model = model.to_empty(device=device)
    loaded: set[tuple[int, int | None]] = set()
    with torch.no_grad():
        for path in safetensors_files(model_dir):
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    target = _target(model, name)
                    if target is None:
                        continue
                    param, rows = target
                    tensor = f.get_tensor(name)
                    dest = param if rows is None else param[rows]
                    if dest.shape != tensor.shape:
                        raise ValueError(f"model: tensor {name} has shape {tuple(tensor.shape)}, "
                                         f"expected {tuple(dest.shape)}")
                    dest.copy_(tensor)
                    loaded.add((id(param), None if rows is None else rows.start))
    size = cfg.hidden_size
    missing = [n for n, p in model.named_parameters()
               if not all((id(p), s) in loaded for s in ((0, size, 2 * size) if ".qkv." in n else (None,)))]
    if missing:
        raise ValueError(f"model: checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
    model = model.to(dtype).eval()
    if cpu_linear.wants_cpu_linear(device, dtype, "none"):
        pack_encoder_linears(model)
    return model
