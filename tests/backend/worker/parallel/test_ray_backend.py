"""`--distributed-executor-backend ray` on a Ray cluster of two nodes on this machine (Ray's own test
cluster: a head with no CPU, as `ray start --head --num-cpus 0` would make, and a second node with
two), found through RAY_ADDRESS: rank 1 runs as a Ray actor on the second node, in a placement
group, the collectives stay gloo over the same TCP rendezvous, greedy tokens equal TP=1's, an actor
that dies takes the engine down, and closing the engine leaves no placement group behind. Without
the package, the backend is refused with the install hint."""
from __future__ import annotations

import importlib.util

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine import EngineConfig
from kvserve.backend.worker import WorkerLost

pytestmark = pytest.mark.timeout(600)

ARGS = dict(max_model_len=256, num_kv_blocks=64)
PROMPTS = ["hello world", "a b c d e f g h", "the quick brown fox jumps"]


def test_ray_is_refused_by_name_without_the_package_or_a_world(llama_dir, monkeypatch):
    with pytest.raises(ValueError, match="a world of one rank has none"):
        EngineConfig(model=llama_dir, distributed_executor_backend="ray")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"'ray' needs the ray package.*pip install 'kvserve\[ray\]'"):
        EngineConfig(model=llama_dir, tensor_parallel_size=2, distributed_executor_backend="ray")


@pytest.fixture()
def two_node_cluster(monkeypatch):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    import ray
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    node = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    try:
        yield ray, node.node_id
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_tp2_on_a_ray_actor_of_another_node_equals_tp1_and_a_dead_actor_stops_it(llama_dir, two_node_cluster):
    ray, second_node = two_node_cluster
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(model=llama_dir, **ARGS).generate(PROMPTS, params)]
    llm = LLM(model=llama_dir, tensor_parallel_size=2, distributed_executor_backend="ray", **ARGS)
    executor = llm.engine.runner.executor
    assert executor.procs == [] and len(executor.ray_ranks.actors) == 1  # no local worker process
    assert ray.util.placement_group_table(executor.ray_ranks.group)["bundles_to_node_id"][1] == second_node
    assert ray.get_runtime_context().get_node_id() != second_node  # the engine is on the head node
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == expected
    llm.engine.runner.check_workers()  # all there
    ray.kill(executor.ray_ranks.actors[0])
    with pytest.raises(WorkerLost, match="rank 1 .*Ray actor.* ended"):
        for _ in range(100):
            executor.ray_ranks.next_check = 0.0
            llm.engine.runner.check_workers()
            ray.wait(executor.ray_ranks.runs, timeout=0.1)
    llm.engine.runner.close(graceful=False)
    assert ray.util.placement_group_table(executor.ray_ranks.group)["state"] == "REMOVED"
