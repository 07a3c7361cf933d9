"""Suffix decoding's parts: the counted suffix trie against brute-force substring counts, and the
proposer's choices (evidence-sized guesses, the probability floor, other requests' outputs per
tenant, the bounded cache), then the engine reusing a finished request's output."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.spec_decode import SuffixProposer, SuffixTree, parse_speculative_config
from kvserve.backend.spec_decode.suffix_tree import ROOT


def _paths(tree: SuffixTree, node: int = ROOT, prefix: tuple = ()) -> dict[tuple, int]:
    out = {}
    for token, child in tree.children(node).items():
        path = prefix + (token,)
        out[path] = tree.count(child)
        out.update(_paths(tree, child, path))
    return out


def _substrings(seqs, depth: int) -> Counter:
    want = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + depth) + 1):
                want[tuple(seq[i:j])] += 1
    return want


def test_tree_counts_every_substring_up_to_the_depth():
    tree = SuffixTree(3)
    tree.insert([1, 2, 1, 2, 3])  # the docstring's a b a b c
    assert _paths(tree) == dict(_substrings([[1, 2, 1, 2, 3]], 3))
    assert tree.count(tree.find([1, 2])) == 2 and tree.find([2, 1, 2, 3]) is None
    assert tree.find([3, 1]) is None


def test_tree_insert_and_remove_agree_with_brute_force():
    rng = random.Random(7)
    seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    tree = SuffixTree(6)
    for seq in seqs:
        tree.insert(seq)
    assert _paths(tree) == dict(_substrings(seqs, 6))
    for seq in seqs[:17]:
        tree.remove(seq)
    assert _paths(tree) == dict(_substrings(seqs[17:], 6))
    for seq in seqs[17:]:
        tree.remove(seq)
    assert tree.num_nodes == 0
    tree.insert(seqs[0])  # freed nodes are reused
    assert _paths(tree) == dict(_substrings(seqs[:1], 6))


def test_appending_token_by_token_equals_one_insert():
    rng = random.Random(3)
    seq = [rng.randrange(4) for _ in range(50)]
    whole, grown = SuffixTree(5), SuffixTree(5)
    whole.insert(seq)
    frontier = []
    for token in seq:
        frontier = grown.append(frontier, token)
    assert _paths(whole) == _paths(grown)
    # The frontier holds the current suffixes, longest (max_depth tokens) first.
    assert frontier == [grown.find(seq[len(seq) - m:]) for m in range(5, 0, -1)]


@dataclass
class FakeRequest:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    cache_salt: str | None = None
    status: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(finished=False, value="running"))

    @property
    def sampling_params(self):
        return SimpleNamespace(cache_salt=self.cache_salt)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        return (self.prompt_token_ids + self.output_token_ids)[start:end]

    def finish(self, value: str = "stop") -> None:
        self.status = SimpleNamespace(finished=True, value=value)


def _proposer(**kw) -> SuffixProposer:
    args = dict(max_depth=24, max_cached_requests=8, max_spec_factor=1.0, min_token_prob=0.1) | kw
    return SuffixProposer(**args)


def test_a_repeated_passage_is_proposed_at_the_length_its_match_earns():
    passage = list(range(100, 130))
    req = FakeRequest("a", [7, 8] + passage + [9] + passage[:12])
    p = _proposer()
    # 12 tokens match the passage (13 with the 9? no: 9 breaks it): at most ceil(1.0 * 12) tokens.
    assert p.propose(req, 16) == passage[12:24]
    assert p.propose(req, 5) == passage[12:17]  # k bounds it too
    req.output_token_ids = passage[12:14]  # the output grows: the tree follows it
    assert p.propose(req, 16)[:4] == passage[14:18]
    assert _proposer(max_spec_factor=0.5).propose(FakeRequest("b", req.prompt_token_ids), 16) == passage[12:18]


def test_ambiguous_continuations_fall_below_the_probability_floor():
    # After [1, 2] came 3, 4, 5, 6 once each (after [0, 1, 2]: 4, 5, 6): no continuation
    # reaches 0.4, so nothing is proposed; with a floor of 0.3, a 1-in-3 guess goes through.
    prompt = [1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2]
    assert _proposer(min_token_prob=0.4).propose(FakeRequest("a", prompt), 8) == []
    assert _proposer(min_token_prob=0.3).propose(FakeRequest("a", prompt), 8)[:1] == [4]
    # The most frequent one wins when it clears the floor: 3 follows [1, 2] three times of five.
    prompt = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 5, 0, 1, 2]
    assert _proposer(min_token_prob=0.4).propose(FakeRequest("b", prompt), 8)[:1] == [3]


def test_finished_outputs_are_proposed_to_later_requests_of_the_same_tenant_only():
    p = _proposer()
    answer = list(range(200, 240))
    first = FakeRequest("first", [1, 2, 3], answer, cache_salt="tenant-a")
    p.propose(first, 4)
    first.finish("stop")
    p.sync([])
    assert p.num_cached_requests == 1
    same = FakeRequest("same", [5, 6] + answer[:10], cache_salt="tenant-a")
    other = FakeRequest("other", [5, 6] + answer[:10], cache_salt="tenant-b")
    assert p.propose(same, 10) == answer[10:20]
    assert p.propose(other, 10) == []


def test_aborted_and_failed_requests_are_not_cached_and_preempted_ones_keep_their_tree():
    p = _proposer()
    for value in ("abort", "error"):
        req = FakeRequest(value, [1, 2], [3, 4, 5, 6])
        p.propose(req, 2)
        req.finish(value)
        p.sync([])
    assert p.num_cached_requests == 0
    waiting = FakeRequest("w", [1, 2, 3, 1, 2])
    p.propose(waiting, 2)
    p.sync([])  # not running (preempted) and not finished
    assert "w" in p._requests


def test_the_cache_forgets_its_oldest_outputs():
    p = _proposer(max_cached_requests=2)
    outputs = [list(range(1000 * i, 1000 * i + 20)) for i in range(1, 4)]
    for i, out in enumerate(outputs):
        req = FakeRequest(f"r{i}", [0], out)
        p.propose(req, 1)
        req.finish("length")
        p.sync([])
    assert p.num_cached_requests == 2
    assert p.propose(FakeRequest("q0", [9] + outputs[0][:5]), 4) == []  # forgotten
    assert p.propose(FakeRequest("q2", [9] + outputs[2][:5]), 4) == outputs[2][5:9]


def test_config_suffix_defaults_and_refusals():
    c = parse_speculative_config({"method": "suffix"})
    assert (c.method, c.num_speculative_tokens, c.suffix_decoding_max_tree_depth,
            c.suffix_decoding_max_spec_factor, c.suffix_decoding_min_token_prob) == ("suffix", 16, 24, 1.0, 0.1)
    c = parse_speculative_config({"method": "suffix", "suffix_decoding_max_tree_depth": 8})
    assert c.num_speculative_tokens == 8
    for bad, name in (({"suffix_decoding_min_token_prob": 1.5}, "suffix_decoding_min_token_prob"),
                      ({"suffix_decoding_max_spec_factor": 0}, "suffix_decoding_max_spec_factor"),
                      ({"suffix_decoding_max_tree_depth": 1}, "suffix_decoding_max_tree_depth"),
                      ({"suffix_decoding_max_cached_requests": -1}, "suffix_decoding_max_cached_requests"),
                      ({"prompt_lookup_min": 2}, "prompt_lookup_min")):
        with pytest.raises(ValueError) as err:
            parse_speculative_config({"method": "suffix", **bad})
        assert str(err.value).startswith(f"speculative_config.{name}:")


def test_the_engine_proposes_a_finished_answer_to_a_request_that_continues_it(llama_dir):
    """A request that resumes an earlier answer (a retried call, an agent re-reading its last turn)
    gets the rest of that answer proposed from the shared tree: far more accepted tokens than the
    same engine with no cache, and greedy tokens exact either way."""
    greedy = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    engines = {cached: LLM(model=llama_dir, max_model_len=256, enable_prefix_caching=False, speculative_config={
        "method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_cached_requests": cached})
        for cached in (0, 4)}
    accepted = {}
    for cached, spec in engines.items():
        first = spec.generate("A list of the things we need to buy at the market today:", greedy)[0]
        answer = first.outputs[0].token_ids
        assert spec.engine.speculator.proposer.num_cached_requests == 0  # cached at the next step
        before = spec.engine.speculator.counters.num_accepted_tokens
        follow = spec.generate(first.prompt_token_ids + answer[:8],
                               SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
        assert follow.outputs[0].token_ids == answer[8:48]  # the same context: the same greedy tokens
        assert spec.engine.speculator.proposer.num_cached_requests == min(cached, 1)
        accepted[cached] = spec.engine.speculator.counters.num_accepted_tokens - before
    assert accepted[4] >= 20 and accepted[4] > accepted[0], accepted
