"""PEFT adapters read and checked against the model: the weights as peft saved them, the scaling
(rsLoRA too), and every refusal naming its problem."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from kvserve.backend.lora import LoRAError, LoRARequest, TargetShapes, load_adapter
from kvserve.backend.models import load_arch_config
from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def hf_llama(llama_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def shapes(llama_dir) -> TargetShapes:
    return TargetShapes.of(load_arch_config(llama_dir))


@pytest.fixture(scope="module")
def adapter_dir(hf_llama, tmp_path_factory) -> Path:
    spec = AdapterSpec(rank=8, alpha=16, targets=("q_proj", "v_proj", "down_proj"), seed=3)
    return make_adapter(hf_llama, tmp_path_factory.mktemp("lora") / "a", spec)


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def _load(folder: Path, shapes: TargetShapes, max_rank: int = 16):
    return load_adapter(LoRARequest("a", 1, str(folder)), shapes, max_rank)


def test_weights_and_scaling_as_peft_saved_them(adapter_dir, shapes, hf_llama) -> None:
    from safetensors.torch import load_file
    adapter = _load(adapter_dir, shapes)
    assert adapter.rank == 8 and adapter.scaling == 2.0
    assert adapter.targets == {"q_proj", "v_proj", "down_proj"}
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    a, b = adapter.weights[(1, "v_proj")]
    assert torch.equal(a, saved["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"])
    assert torch.equal(b, saved["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"])
    assert b.abs().max() > 0  # the seeded weights, not peft's zero start
    assert len(adapter.weights) == 3 * shapes.num_layers


def test_rslora_scaling(hf_llama, shapes, tmp_path) -> None:
    folder = make_adapter(hf_llama, tmp_path / "rs", AdapterSpec(4, 8, ("o_proj",), seed=1, use_rslora=True))
    assert math.isclose(_load(folder, shapes).scaling, 8 / math.sqrt(4))


def test_rank_over_the_limit(adapter_dir, shapes) -> None:
    with pytest.raises(LoRAError, match="rank 8 exceeds max_lora_rank 4"):
        _load(adapter_dir, shapes, max_rank=4)


def test_missing_tensor(adapter_dir, shapes, tmp_path) -> None:
    from safetensors.torch import load_file, save_file
    folder = _copy(adapter_dir, tmp_path)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    del tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(LoRAError, match=r"missing tensor base_model\.model\.model\.layers\.0\.mlp\.down_proj\.lora_B"):
        _load(folder, shapes)


def test_extra_tensor(adapter_dir, shapes, tmp_path) -> None:
    from safetensors.torch import load_file, save_file
    folder = _copy(adapter_dir, tmp_path)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(8, 4)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(LoRAError, match=r"unexpected tensor base_model\.model\.lm_head\.lora_A"):
        _load(folder, shapes)


def test_a_target_the_model_lacks(adapter_dir, shapes, tmp_path) -> None:
    folder = _copy(adapter_dir, tmp_path)
    _edit_config(folder, target_modules=["q_proj", "fc1"])
    with pytest.raises(LoRAError, match="target 'fc1' is not a module of the model"):
        _load(folder, shapes)


def test_wrong_shape(adapter_dir, shapes, tmp_path) -> None:
    from safetensors.torch import load_file, save_file
    folder = _copy(adapter_dir, tmp_path)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
    tensors[key] = torch.zeros(8, tensors[key].shape[1] + 1)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(LoRAError, match=r"layers\.1\.self_attn\.q_proj\.lora_A has shape"):
        _load(folder, shapes)


def test_corrupt_safetensors(adapter_dir, shapes, tmp_path) -> None:
    folder = _copy(adapter_dir, tmp_path)
    path = folder / "adapter_model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(LoRAError, match="not a readable safetensors file"):
        _load(folder, shapes)


@pytest.mark.parametrize("change, message", [
    ({"use_dora": True}, "DoRA"), ({"bias": "all"}, "bias='all'"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "peft_type IA3"), ({"r": 0}, "r must be a positive integer"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
])
def test_unsupported_options(adapter_dir, shapes, tmp_path, change, message) -> None:
    folder = _copy(adapter_dir, tmp_path)
    _edit_config(folder, **change)
    with pytest.raises(LoRAError, match=message):
        _load(folder, shapes)


def test_missing_files_and_gguf(adapter_dir, shapes, tmp_path) -> None:
    with pytest.raises(LoRAError, match="is not a folder"):
        _load(tmp_path / "nowhere", shapes)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LoRAError, match="adapter_config.json does not exist"):
        _load(empty, shapes)
    folder = _copy(adapter_dir, tmp_path)
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    with pytest.raises(LoRAError, match="found adapter_model.bin; only safetensors is read"):
        _load(folder, shapes)
    with pytest.raises(LoRAError, match="GGUF LoRA adapters"):
        _load(tmp_path / "lora.gguf", shapes)


def test_bad_requests_and_error_kinds() -> None:
    with pytest.raises(LoRAError, match="lora_int_id: must be a positive integer"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(LoRAError, match="non-empty name"):
        LoRARequest("", 1, "/x")
    assert LoRAError("x", not_found=True).kind.value == "not_found" and LoRAError("x").kind.value == "invalid"
