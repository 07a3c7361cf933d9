"""The prompt list of `kvserve bench --compare`: token ids of exact lengths.

Every baseline gets the very same ids, so no tokenizer can make one prompt a
token longer for one system than for another: transformers takes them as
`input_ids`, `LLM.generate` as a list of ints, and the OpenAI completions
endpoint as `"prompt": [ids]` (the API's token-id form; no BOS is added by any
of the three). Lengths come from the dataset's own length draws, so a compare
run has the length distribution `--dataset-name` describes.

Ids are uniform below `vocab_size`, which the caller sets to the ids both the
model and its tokenizer know (compare_model.prompt_vocab_size): a random-weight
model does not care which tokens it reads, and uniform ids share no prefix by
accident (the shared-prefix dataset shares one on purpose).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.datasets import Dataset, LognormalDataset, RandomDataset, SharedPrefixDataset, rng_for

# Generator streams of our own, well away from those datasets.py uses for text.
_IDS, _PREFIX_IDS, _QUESTION_IDS, _SHUFFLE, _RELABEL = 100, 101, 102, 103, 104


@dataclass(slots=True)
class CompareRequest:
    index: int  # arrival order: all baselines serve requests in this order
    prompt_ids: list[int]
    output_len: int  # exact: every baseline ignores EOS
    prefix_id: int | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def as_bench_request(self) -> BenchRequest:
        """For the HTTP client: the completions endpoint accepts token ids as
        `prompt`, so the body carries the ids themselves (BenchRequest.prompt
        is usually text; the client only JSON-encodes it)."""
        return BenchRequest(self.index, self.prompt_ids, self.prompt_len,  # type: ignore[arg-type]
                            self.output_len, prefix_id=self.prefix_id, exact_len=True)


def _ids(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    return rng.integers(0, vocab_size, size=int(n)).tolist()


def token_prompts(dataset: Dataset, vocab_size: int) -> list[CompareRequest]:
    """One request per dataset entry, ids in [0, vocab_size), deterministic in the seed."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if isinstance(dataset, (RandomDataset, LognormalDataset)):
        ins, outs = dataset.lengths()
        return [CompareRequest(i, _ids(rng_for(dataset.seed, _IDS, i), ins[i], vocab_size), int(outs[i]))
                for i in range(len(ins))]
    if isinstance(dataset, SharedPrefixDataset):
        ds = dataset
        prefixes = [_ids(rng_for(ds.seed, _PREFIX_IDS, p), ds.prefix_len, vocab_size)
                    for p in range(ds.num_prefixes)]
        # Interleave tenants as the text dataset does: sorted order would flatter the prefix cache.
        order = rng_for(ds.seed, _SHUFFLE).permutation(ds.num_prompts)
        out = []
        for slot, k in enumerate(order):
            p, q = divmod(int(k), ds.questions_per_prefix)
            question = _ids(rng_for(ds.seed, _QUESTION_IDS, p, q), ds.question_len, vocab_size)
            out.append(CompareRequest(slot, prefixes[p] + question, ds.output_len, prefix_id=p))
        return out
    raise ValueError(f"--compare does not know dataset {getattr(dataset, 'name', dataset)!r}")


def relabel(requests: list[CompareRequest], round_index: int, vocab_size: int) -> list[CompareRequest]:
    """The same workload with other token ids: every id mapped through one random
    permutation of [0, vocab_size) per round (round 0: unchanged). Lengths, output
    lengths and which prompts share a prefix stay as they were; no full KV block
    of one round matches another's, so a prefix cache kept from an earlier round
    cannot make a later one faster."""
    if round_index == 0:
        return list(requests)
    perm = rng_for(round_index, _RELABEL).permutation(vocab_size)
    return [replace(r, prompt_ids=[int(perm[t]) for t in r.prompt_ids]) for r in requests]


def describe_prompts(requests: list[CompareRequest]) -> dict[str, object]:
    ins = np.array([r.prompt_len for r in requests])
    outs = np.array([r.output_len for r in requests])
    return {
        "num_requests": len(requests),
        "total_input_tokens": int(ins.sum()),
        "total_output_tokens": int(outs.sum()),
        "input_len_min": int(ins.min()), "input_len_median": float(np.median(ins)), "input_len_max": int(ins.max()),
        "output_len_min": int(outs.min()), "output_len_median": float(np.median(outs)),
        "output_len_max": int(outs.max()),
    }
