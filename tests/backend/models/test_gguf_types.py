"""GGUF checkpoints of every supported tensor type: kvserve's loaded weights equal transformers'
dequantized tensors exactly, and its greedy tokens equal transformers' on the same file."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models.gguf_checkpoint import SUPPORTED_TENSOR_TYPES
from kvserve.backend.models.loader import load_model
from tests.backend.models.gguf_writer import write_random_gguf

TYPES = sorted(SUPPORTED_TENSOR_TYPES)
PROMPTS = [[5, 17, 42], [300, 2, 9, 9, 9, 120, 64], list(range(40, 70))]
MAX_NEW = 12


@functools.lru_cache(maxsize=None)
def _gguf(kind: str, root: str) -> Path:
    return write_random_gguf(Path(root) / f"random-{kind}.gguf", kind, seed=len(kind))


@pytest.fixture(scope="module")
def gguf_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gguf"))


def _hf_model(path: Path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _hf_weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def loaded_as_hf(path: str | Path) -> dict[str, torch.Tensor]:
    """The loader's float32 parameters (before the runner repacks linears for the CPU), its fused
    projections split back into Hugging Face's names."""
    model, _ = load_model(path, torch.float32, torch.device("cpu"), max_position=64)
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
        gate, up = layer.gate_up_proj.weight.chunk(2)
        out |= {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": layer.o_proj.weight,
                p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.down_proj.weight,
                p + "input_layernorm.weight": layer.input_layernorm,
                p + "post_attention_layernorm.weight": layer.post_attention_layernorm}
    return out


@pytest.mark.parametrize("kind", TYPES)
def test_weights_and_greedy_tokens_match_transformers(kind: str, gguf_root: str) -> None:
    path = _gguf(kind, gguf_root)
    hf = _hf_model(path)
    ours, theirs = loaded_as_hf(path), _hf_weights(hf)
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), f"{kind}: {name} differs from transformers' dequantization"
    llm = LLM(model=str(path), dtype="float32", max_num_seqs=4)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    with torch.inference_mode():
        for prompt, out in zip(PROMPTS, outs):
            x = torch.tensor([prompt])
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW,
                              min_new_tokens=MAX_NEW, do_sample=False)[0, len(prompt):].tolist()
            assert out.outputs[0].token_ids == ref, kind


def test_unsupported_types_and_architectures_are_refused_by_name(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    from kvserve.backend.models import gguf_checkpoint
    path = tmp_path / "other.gguf"
    writer = GGUFWriter(str(path), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF architecture 'mamba' is not supported"):
        LLM(model=str(path))

    class FakeTensor:  # an IQ type the loader does not claim
        name, tensor_type, shape, data = "blk.0.attn_q.weight", 16, [256, 4], None
    with pytest.raises(ValueError, match="GGUF tensor type IQ2_XXS .* is not supported"):
        gguf_checkpoint.dequantize(FakeTensor())
