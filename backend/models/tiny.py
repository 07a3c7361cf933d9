"""`kvserve make-tiny-model DIR`: a deterministic small model in the Hugging Face layout.

Random weights (seeded), a byte-level BPE tokenizer trained on the corpus
shipped with kvserve, and a ChatML chat template. It is loaded by the same code
as a real checkpoint; it is the built-in default model and the test model.
Writing is atomic (temporary folder, then rename) so concurrent callers agree.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

_CORPUS = Path(__file__).resolve().parent / "corpus.txt"
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_FORMAT = 2  # bump when the files written for a given spec change
_ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
          "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


@dataclass(slots=True)
class TinySpec:
    arch: str = "llama"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    vocab_size: int = 512
    max_position: int = 2048
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    rope_theta: float = 10000.0
    seed: int = 0
    # mistral, qwen2, gemma3: the window of their sliding layers (mistral: every layer; qwen2: the
    # layers from the second on; gemma3: all but every sixth and the last), None for none.
    sliding_window: int | None = None


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = _CORPUS.read_text(encoding="utf-8")
    tok.train_from_iterator([line for line in text.splitlines() if line], trainer=trainer)
    return tok


def _weights(spec: TinySpec, vocab: int, head_dim: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)

    def rand(*shape, std=None):
        std = std if std is not None else shape[-1] ** -0.5
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    def norm(n):
        # Gemma's norms multiply by 1 + w: their weights are centred on zero.
        centre = 0.0 if spec.arch == "gemma3" else 1.0
        return (centre + 0.1 * torch.randn(n, generator=g)).to(dtype)

    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * head_dim, spec.num_kv_heads * head_dim
    # Gemma scales the embedding by sqrt(hidden): unscaled it would drown every layer's output.
    embed_std = h ** -0.5 if spec.arch == "gemma3" else 1.0
    w = {"model.embed_tokens.weight": rand(vocab, h, std=embed_std), "model.norm.weight": norm(h)}
    if not spec.tie_word_embeddings:
        w["lm_head.weight"] = rand(vocab, h)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(q, h)
        w[p + "self_attn.k_proj.weight"] = rand(kv, h)
        w[p + "self_attn.v_proj.weight"] = rand(kv, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, q)
        if spec.arch == "qwen2":
            for name, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                w[p + f"self_attn.{name}.bias"] = rand(n, std=0.1)
        if spec.arch in ("qwen3", "gemma3"):
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        if spec.arch == "gemma3":
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = rand(inter, h)
        w[p + "mlp.up_proj.weight"] = rand(inter, h)
        w[p + "mlp.down_proj.weight"] = rand(h, inter)
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
    return {k: v.contiguous() for k, v in w.items()}


def _config(spec: TinySpec, vocab: int, head_dim: int, eos: list[int], bos: int) -> dict:
    cfg = {
        "architectures": [_ARCHS[spec.arch]], "model_type": spec.arch,
        "vocab_size": vocab, "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": spec.max_position, "rms_norm_eps": 1e-6, "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tie_word_embeddings, "torch_dtype": spec.dtype,
        "bos_token_id": bos, "eos_token_id": eos, "attention_dropout": 0.0,
    }
    if spec.arch == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    window = spec.sliding_window
    if spec.arch == "mistral":
        cfg["sliding_window"] = window
        if window:
            cfg["layer_types"] = ["sliding_attention"] * spec.num_layers
    if spec.arch == "qwen2" and window:
        cfg.update(use_sliding_window=True, sliding_window=window, max_window_layers=1,
                   layer_types=["full_attention"] + ["sliding_attention"] * (spec.num_layers - 1))
    if spec.arch == "gemma3":
        # Every sixth layer and the last see the whole context, so that two layers already hold both kinds.
        types = ["full_attention" if (i + 1) % 6 == 0 or i == spec.num_layers - 1 else "sliding_attention"
                 for i in range(spec.num_layers)]
        cfg.update(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=head_dim,
                   sliding_window=window or spec.max_position, layer_types=types,
                   final_logit_softcapping=None, attn_logit_softcapping=None,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": spec.rope_theta * 100},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": spec.rope_theta}})
        del cfg["hidden_act"], cfg["rope_theta"]
    return cfg


def make_tiny_model(out_dir: str | Path, spec: TinySpec | None = None) -> Path:
    """Write the model into out_dir unless it already holds this exact spec. Returns out_dir."""
    from safetensors.torch import save_file

    spec = spec or TinySpec()
    if spec.arch not in _ARCHS:
        raise ValueError(f"arch: must be one of {sorted(_ARCHS)}")
    out = Path(out_dir)
    marker = out / "kvserve_tiny.json"
    record = {"format": _FORMAT, **asdict(spec)}
    if marker.is_file() and json.loads(marker.read_text()) == record:
        return out
    tok = train_tokenizer(spec.vocab_size)
    # A small corpus caps the BPE vocabulary: fill the rest with plain added tokens so that
    # every id the model can emit decodes to some text (benchmarks count streamed chunks).
    missing = spec.vocab_size - tok.get_vocab_size()
    if missing > 0:
        from tokenizers import AddedToken
        tok.add_tokens([AddedToken(f"<|x{i}|>", special=False, normalized=False) for i in range(missing)])
    vocab = tok.get_vocab_size()
    head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    bos = tok.token_to_id("<|endoftext|>")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        tok.save(str(tmp / "tokenizer.json"))
        save_file(_weights(spec, vocab, head_dim), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(_config(spec, vocab, head_dim, eos, bos), indent=2))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": bos}))
        (tmp / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": _CHAT_TEMPLATE,
            "model_max_length": spec.max_position,
        }, indent=2))
        (tmp / "kvserve_tiny.json").write_text(json.dumps(record))
        _publish(tmp, out, marker, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _publish(tmp: Path, out: Path, marker: Path, spec: dict) -> None:
    """Move tmp to out unless a concurrent writer already published the same model there.

    A folder that exists is never deleted while it holds this spec, so readers never
    see it vanish; only a folder with another spec is replaced.
    """
    try:
        os.rename(tmp, out)
        return
    except OSError:
        if marker.is_file() and json.loads(marker.read_text()) == spec:
            return
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def default_model_dir() -> Path:
    from kvserve.backend.models.fetch import cache_dir
    return cache_dir() / "tiny-default"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvserve make-tiny-model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=None, help="default: the built-in model's cache folder")
    for f, default in asdict(TinySpec()).items():
        flag = "--" + f.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            kind = int if f in ("head_dim", "sliding_window") else type(default)
            parser.add_argument(flag, type=kind, default=default)
    args = vars(parser.parse_args(argv))
    out_dir = args.pop("out_dir") or default_model_dir()
    path = make_tiny_model(out_dir, TinySpec(**args))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
