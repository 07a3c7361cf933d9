"""EmbeddingBatcher with num_workers: passes side by side, a burst split between idle
workers, and the model's threads shared between the passes that run at once (a fake
embedder: the batching, not the model, is under test)."""
from __future__ import annotations

import threading

import torch

from kvserve.backend.embed.embed_batcher import EmbeddingBatcher, EmbedJob
from kvserve.backend.embed.embedder import EmbedderConfig


class GatedEmbedder:
    """Each input's vector is [its first id, its length]; the first pass waits for `gate`."""

    def __init__(self, **config) -> None:
        self.config = EmbedderConfig(model="unused", **config)
        self.device = torch.device("cpu")
        self.gate = threading.Event()
        self.first_started = threading.Event()
        self.passes: list[tuple[int, int]] = []  # (inputs, threads) per pass, in the order they started
        self._lock = threading.Lock()

    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        with self._lock:
            first = not self.passes
            self.passes.append((len(inputs), torch.get_num_threads()))
        if first:
            self.first_started.set()
            assert self.gate.wait(10)
        return torch.tensor([[float(ids[0]), float(len(ids))] for ids in inputs])

    def finish(self, vectors, dimensions, normalize):
        return vectors


def _collect(n: int):
    results, done = {}, threading.Event()

    def on_done(result):
        results[result.request_id] = result
        if len(results) == n:
            done.set()
    return results, done, on_done


def _batcher(fake: GatedEmbedder, threads: int = 2) -> EmbeddingBatcher:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)  # the batcher reads the constructing thread's count
    try:
        return EmbeddingBatcher(fake)
    finally:
        torch.set_num_threads(saved)


def _wait_for_passes(fake: GatedEmbedder, n: int) -> bool:
    for _ in range(1000):
        if len(fake.passes) >= n:
            return True
        threading.Event().wait(0.01)
    return False


def test_a_burst_is_split_between_idle_workers_side_by_side_on_a_thread_each():
    fake = GatedEmbedder(num_workers=2)
    batcher = _batcher(fake)
    results, done, on_done = _collect(1)
    inputs = [[i, 0, 0][: 1 + i % 3] for i in range(1, 10)]
    batcher.submit(EmbedJob("burst", inputs, None, None, on_done))
    assert fake.first_started.wait(10)
    # One worker took its half (5 of 9) and one thread, the other the rest beside it.
    assert _wait_for_passes(fake, 2)
    fake.gate.set()
    assert done.wait(10)
    batcher.shutdown()
    assert sorted(fake.passes) == [(4, 1), (5, 1)]  # (which enters embed first is up to the scheduler)
    # The workers' counts are their own: a thread started now begins with the process's default.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert seen == [torch.get_num_threads()]
    result = results["burst"]
    assert result.num_passes == 2
    assert result.embeddings.tolist() == [[float(ids[0]), float(len(ids))] for ids in inputs]


def test_a_lone_pass_takes_every_thread_and_nothing_starts_beside_it():
    fake = GatedEmbedder(num_workers=2)
    batcher = _batcher(fake)
    results, done, on_done = _collect(2)
    batcher.submit(EmbedJob("held", [[7, 1]], None, None, on_done))
    assert fake.first_started.wait(10)
    # Both threads are the held pass's: a second pass beside it would oversubscribe the cores.
    batcher.submit(EmbedJob("after", [[9, 1, 1]], None, None, on_done))
    assert not done.wait(0.3) and not results and len(fake.passes) == 1
    fake.gate.set()
    assert done.wait(10)
    batcher.shutdown()
    assert fake.passes == [(1, 2), (1, 2)]
    assert results["held"].embeddings.tolist() == [[7.0, 2.0]]
    assert results["after"].embeddings.tolist() == [[9.0, 3.0]]


def test_a_split_shares_the_threads_equally():
    fake = GatedEmbedder(num_workers=2)
    batcher = _batcher(fake, threads=4)
    results, done, on_done = _collect(1)
    batcher.submit(EmbedJob("pair", [[1], [2]], None, None, on_done))
    assert fake.first_started.wait(10) and _wait_for_passes(fake, 2)
    fake.gate.set()
    assert done.wait(10)
    batcher.shutdown()
    assert fake.passes == [(1, 2), (1, 2)]


def test_one_worker_runs_one_pass_at_a_time():
    fake = GatedEmbedder(num_workers=1)
    batcher = EmbeddingBatcher(fake)
    results, done, on_done = _collect(2)
    batcher.submit(EmbedJob("held", [[7]], None, None, on_done))
    assert fake.first_started.wait(10)
    batcher.submit(EmbedJob("behind", [[9]], None, None, on_done))
    assert not done.wait(0.3) and not results
    fake.gate.set()
    assert done.wait(10)
    batcher.shutdown()
    assert len(fake.passes) == 2
