"""KV waste benchmark: allocated-but-unused token slots per running request.

Drives the real Scheduler and KVCacheManager (no model: the "sampled" token is
a constant) with 200 requests whose prompt and output lengths are log-normal,
and reports, over every step, the unused slots per running request. Paging
promises less than one block per request; contiguous allocation at
max_model_len is printed beside it for scale.

    python -m kvserve.loadtests.studies.kv_waste [--requests 200] [--block-size 16] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import statistics

from kvserve.backend.engine.request import Request, RequestStatus
from kvserve.backend.engine.sampling_params import SamplingParams
from kvserve.backend.engine.scheduler import Scheduler
from kvserve.backend.kv_cache.manager import KVCacheManager


def _lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, int(rng.lognormvariate(0, sigma) * median)))


def run(num_requests: int, block_size: int, seed: int, max_model_len: int = 2048) -> dict:
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks=4096, block_size=block_size, enable_caching=False)
    sched = Scheduler(kv, max_num_seqs=64, max_num_batched_tokens=2048)
    targets: dict[str, int] = {}
    lengths: list[int] = []
    for i in range(num_requests):
        prompt = _lognormal_int(rng, 200, 0.8, 4, 1500)
        out_len = _lognormal_int(rng, 100, 1.0, 1, max_model_len - prompt)
        req = Request(f"r{i}", [rng.randrange(1000) for _ in range(prompt)],
                      SamplingParams(max_tokens=out_len, ignore_eos=True), cache_key=None)
        targets[req.request_id] = out_len
        lengths.append(prompt + out_len)
        sched.add_request(req)
    per_request_waste: list[float] = []
    worst = 0
    steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update_from_output(out, {s.request_id: 1 for s in out.scheduled if s.samples})
        for req in list(sched.running):
            slots = len(kv.block_ids(req.request_id)) * block_size
            waste = slots - req.num_computed_tokens
            worst = max(worst, waste)
            per_request_waste.append(waste)
        for req in list(sched.running):
            if req.num_output_tokens >= targets[req.request_id]:
                sched.finish_request(req.request_id, RequestStatus.FINISHED_LENGTH)
        steps += 1
    assert kv.num_free_blocks == kv.num_usable_blocks, "blocks leaked"
    return {"requests": num_requests, "steps": steps, "block_size": block_size,
            "mean_waste_tokens": statistics.fmean(per_request_waste), "max_waste_tokens": worst,
            # What reserving max_model_len per request (pre-paging servers) would leave unused.
            "contiguous_mean_waste_tokens": max_model_len - statistics.fmean(lengths)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = run(a.requests, a.block_size, a.seed)
    print(f"{r['requests']} requests, {r['steps']} steps, block size {r['block_size']}")
    print(f"unused slots per running request: mean {r['mean_waste_tokens']:.2f} tokens, "
          f"max {r['max_waste_tokens']} tokens (< one block = {r['block_size']}: "
          f"{'yes' if r['max_waste_tokens'] < r['block_size'] else 'NO'})")
    print(f"contiguous allocation at max_model_len would leave {r['contiguous_mean_waste_tokens']:.0f} "
          f"tokens unused per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
