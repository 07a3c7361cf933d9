"""The `draft_model` method on tiny random models: the config and its refusals at start, greedy output
token for token what plain decoding gives (plain, chunked prefill, prefix hits, preemption, abort),
the target as its own draft accepting everything (the plumbing), the draft's KV following the
target's blocks (nothing left once requests end), and seeded sampling keeping the target
distribution through the min(1, p/q) rule with a draft whose q is not one-hot."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from kvserve.backend.spec_decode import parse_speculative_config, verify_with_draft_probs
from tests.backend.spec_decode.test_spec_engine import PROMPTS, _chi2_critical, _two_sample_chi2
from tests.conftest import MODEL_CACHE

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tempered_draft(llama_dir, tmp_path_factory) -> str:
    """The target with a flatter head (its logits x 0.6) and noise on them: the same tokenizer, a
    distribution q that overlaps p without equalling it, so draws are accepted and rejected."""
    folder = tmp_path_factory.mktemp("draft") / "tempered"
    shutil.copytree(llama_dir, folder)
    weights = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(5)
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = (head * 0.6 + 0.02 * torch.randn(head.shape, generator=g)).contiguous()
    save_file(weights, folder / "model.safetensors")
    return str(folder)


def _config(model: str, k: int = 4, policy: str = "off") -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k, "load_policy": policy}


def _tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _all_free(llm) -> bool:
    """Every block back in the pool and, after one more (empty) step that hands the draft the
    finished ids, no draft state kept for any request."""
    llm.engine.step()
    kv = llm.engine.kv
    return (kv.num_free_blocks == kv.num_usable_blocks and not llm.engine.groups
            and llm.engine.speculator.draft.num_tracked() == 0)


def _counters(llm):
    return llm.engine.speculator.counters


# ---- the config ----------------------------------------------------------------------------
def test_config_draft_model_and_method_implied_by_model(llama_dir):
    c = parse_speculative_config({"method": "draft_model", "model": llama_dir, "num_speculative_tokens": 3})
    assert (c.method, c.model, c.num_speculative_tokens) == ("draft_model", llama_dir, 3)
    c = parse_speculative_config(json.dumps({"model": llama_dir, "num_speculative_tokens": 2}))
    assert (c.method, c.num_speculative_tokens) == ("draft_model", 2)


@pytest.mark.parametrize("change, field", [
    ({"model": None}, "speculative_config.model"),
    ({"model": "/nonexistent/draft"}, "speculative_config.model"),
    ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"num_speculative_tokens": 17}, "speculative_config.num_speculative_tokens"),
    ({"num_speculative_tokens": None}, "speculative_config.num_speculative_tokens"),
    ({"prompt_lookup_max": 3}, "speculative_config.prompt_lookup_max"),
])
def test_config_refusals_name_the_field(llama_dir, change, field):
    config = {**_config(llama_dir), **change}
    config = {key: value for key, value in config.items() if value is not None or key == "model"}
    with pytest.raises(ValueError) as err:
        parse_speculative_config(config)
    assert str(err.value).startswith(field + ":")


def test_a_draft_of_another_vocabulary_is_refused_at_start(llama_dir):
    other = str(make_tiny_model(MODEL_CACHE / "llama-vocab-400", TinySpec(arch="llama", vocab_size=400, seed=9)))
    with pytest.raises(ValueError, match=r"^speculative_config\.model: .*vocabulary"):
        LLM(model=llama_dir, max_model_len=128, speculative_config=_config(other))


def test_a_draft_of_another_tokenizer_is_refused_at_start(llama_dir, tmp_path):
    folder = tmp_path / "swapped"
    shutil.copytree(llama_dir, folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]  # two ordinary tokens trade ids: same size, other tokenizer
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match=r"^speculative_config\.model: .*tokenizer differs"):
        LLM(model=llama_dir, max_model_len=128, speculative_config=_config(str(folder)))


def test_a_missing_draft_is_refused_at_start(llama_dir):
    with pytest.raises(ValueError, match=r"^speculative_config\.model: "):
        LLM(model=llama_dir, max_model_len=128, speculative_config=_config("/nonexistent/draft.gguf"))


# ---- greedy exactness ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(llama_dir, qwen2_dir, tempered_draft):
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False)
    same = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False,
               speculative_config=_config(llama_dir))
    # qwen2's tiny model was trained on the same corpus: the same tokenizer, unrelated weights.
    other = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False,
                speculative_config=_config(qwen2_dir, k=3))
    tempered = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8, enable_prefix_caching=False,
                   speculative_config=_config(tempered_draft))
    return base, same, other, tempered


def test_the_target_as_its_own_draft_accepts_everything_in_greedy(engines):
    base, same, _, _ = engines
    assert _tokens(same) == _tokens(base)
    c = _counters(same)
    assert c.num_draft_tokens > 50 and c.num_accepted_tokens == c.num_draft_tokens
    assert same.engine.stats().spec_decode_num_accepted_tokens_total == c.num_accepted_tokens
    assert _all_free(same)


def test_greedy_with_an_unrelated_or_tempered_draft_equals_plain_decoding(engines):
    base, _, other, tempered = engines
    want = _tokens(base)
    assert _tokens(other) == want and _tokens(tempered) == want
    assert _counters(other).num_draft_tokens > 0 and _counters(other).num_proposer_errors == 0
    # The noise flips many of the tiny model's near-flat argmaxes: about a third are accepted.
    c = _counters(tempered)
    assert 0.2 * c.num_draft_tokens < c.num_accepted_tokens < c.num_draft_tokens
    for p in (1, 2, 3, 7):  # max_tokens inside an accepted run
        params = SamplingParams(max_tokens=p, temperature=0, ignore_eos=True)
        assert _tokens(tempered, params=params) == _tokens(base, params=params)
    assert _all_free(other) and _all_free(tempered)


def test_greedy_with_chunked_prefill_prefix_hits_and_preemption(llama_dir, tempered_draft):
    shared = PROMPTS[0] + " " + PROMPTS[1]
    prompts = [shared + " and then", shared + " but", *PROMPTS]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=4)
    want = _tokens(base, prompts, params)
    # 24-token budget: prompts in chunks beside decodes and proposals; 13 blocks of 16 tokens for 4
    # running requests of ~20-75 prompt + 48 output tokens: preemptions; the shared prompt hits.
    spec = LLM(model=llama_dir, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=14,
               speculative_config=_config(tempered_draft))
    assert _tokens(spec, prompts, params) == want
    assert _tokens(spec, prompts, params) == want  # again: the full blocks are prefix hits now
    assert spec.engine.scheduler.num_preemptions_total > 0 and spec.engine.kv.prefix_hits > 0
    assert _counters(spec).num_accepted_tokens > 0
    assert _all_free(spec)


def test_abort_mid_run_frees_every_block(engines):
    _, _, _, tempered = engines
    engine = tempered.engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"a{i}", prompt, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    for _ in range(6):
        engine.step()
    assert engine.kv.num_free_blocks < engine.kv.num_usable_blocks and engine.speculator.draft.num_tracked() > 0
    for i in range(len(PROMPTS)):
        assert engine.abort(f"a{i}").finished
    assert _all_free(tempered)


def test_the_policy_runs_with_a_draft_and_keeps_greedy_exact(llama_dir, tempered_draft):
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8)
    spec = LLM(model=llama_dir, max_model_len=256, max_num_seqs=8,
               speculative_config=_config(tempered_draft, k=4, policy="measured"))
    assert _tokens(spec, PROMPTS * 2) == _tokens(base, PROMPTS * 2)
    assert spec.engine.speculator.policy.overhead.per_unit > 0  # the draft's forwards were timed
    assert _all_free(spec)


# ---- sampling ------------------------------------------------------------------------------
def test_the_rule_with_q_keeps_p_and_accepts_with_the_overlap():
    """Position 0: a draft d ~ q accepted with min(1, p(d)/q(d)), else a draw from the residual.
    Over 40k tries the emitted token has distribution p and the acceptance rate is sum min(p, q)."""
    p = torch.tensor([0.1, 0.5, 0.25, 0.15])
    q = torch.tensor([0.4, 0.2, 0.3, 0.1])
    target = p.log()[None, :].repeat(2, 1)
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=gen))
        run = verify_with_draft_probs(target, [d], q[None, :], gen)
        counts[run[0]] += 1
        accepted += len(run) == 2
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001
    overlap = float(torch.minimum(p, q).sum())  # 0.65
    assert abs(accepted / n - overlap) < 0.015


def test_the_target_as_its_own_draft_accepts_everything_when_sampling_too(engines):
    """q = p (up to the rounding of another batch shape): min(1, p/q) accepts ~always. A q row
    misaligned with its proposal (or p scaled differently from q) would reject most of them."""
    _, same, _, _ = engines
    before = (_counters(same).num_draft_tokens, _counters(same).num_accepted_tokens)
    params = [SamplingParams(max_tokens=30, temperature=0.8, top_k=20, top_p=0.9, seed=i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    same.generate(PROMPTS, params)
    drafted = _counters(same).num_draft_tokens - before[0]
    accepted = _counters(same).num_accepted_tokens - before[1]
    assert drafted > 50 and accepted >= 0.97 * drafted, (accepted, drafted)


def test_seeded_sampling_with_a_draft_is_reproducible(engines):
    _, _, _, tempered = engines
    p = SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=77, ignore_eos=True)
    alone = _tokens(tempered, [PROMPTS[0]], p)
    crowd = tempered.generate(PROMPTS, [p, *[SamplingParams(max_tokens=30, temperature=1.0)] * 3])
    assert crowd[0].outputs[0].token_ids == alone[0]


@pytest.mark.slow
def test_seeded_sampling_with_a_draft_keeps_the_target_distribution(llama_dir, tempered_draft):
    """2,000 seeded samples with the tempered draft (q not one-hot, not p) against 2,000 without: a
    chi-square at output positions 1-3 finds no difference, while many proposals were rejected."""
    base = LLM(model=llama_dir, max_model_len=256, max_num_seqs=256)
    spec = LLM(model=llama_dir, max_model_len=256, max_num_seqs=256, speculative_config=_config(tempered_draft, k=3))
    prompt = "Once upon a time there was"
    n = 2000

    def sample(llm, offset):
        params = [SamplingParams(max_tokens=5, temperature=0.9, top_k=12, seed=offset + i, ignore_eos=True)
                  for i in range(n)]
        return [o.outputs[0].token_ids for o in llm.generate([prompt] * n, params)]

    without, with_spec = sample(base, 0), sample(spec, 10**6)
    c = _counters(spec)
    assert 200 < c.num_accepted_tokens < c.num_draft_tokens - 200, c
    for position in (1, 2, 3):
        stat, df = _two_sample_chi2([t[position] for t in without], [t[position] for t in with_spec])
        assert df >= 3 and stat < _chi2_critical(df), (position, stat, df)
