"""The LoRA benchmark's pieces: the adapters it writes are PEFT folders kvserve reads (all seven
projections, the asked rank), and a run's requests rotate over the adapters it mixes."""
from __future__ import annotations

from kvserve.backend.lora import LoRARequest, TargetShapes, load_adapter
from kvserve.backend.models import load_arch_config
from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.lora.lora_ab import _RoundRobinModels, write_adapter


def test_written_adapters_load_with_every_target_and_the_rank(llama_dir, tmp_path) -> None:
    folder = write_adapter(tmp_path / "a", llama_dir, rank=16, seed=1)
    shapes = TargetShapes.of(load_arch_config(llama_dir))
    adapter = load_adapter(LoRARequest("a", 1, str(folder)), shapes, max_rank=16)
    assert adapter.rank == 16 and adapter.targets == set(shapes.shapes)
    other = load_adapter(LoRARequest("b", 2, str(write_adapter(tmp_path / "b", llama_dir, 16, seed=2))), shapes, 16)
    assert not adapter.weights[(0, "q_proj")][0].equal(other.weights[(0, "q_proj")][0])


def test_requests_rotate_over_the_models() -> None:
    endpoint = _RoundRobinModels("http://x", ["a", "b", "c"])
    bodies = [endpoint.body(BenchRequest(i, "hi", 1, 4)) for i in range(5)]
    assert [b["model"] for b in bodies] == ["a", "b", "c", "a", "b"]
    assert all(b["ignore_eos"] and b["temperature"] == 0.0 and b["max_tokens"] == 4 for b in bodies)
