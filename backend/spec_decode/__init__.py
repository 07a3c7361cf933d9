"""Speculative decoding: the `--speculative-config` it runs under, the proposers that guess a
request's next tokens (n-gram prompt lookup, suffix decoding, a draft model), and the rule
that accepts or rejects those guesses against the target model's own distribution. The
scheduler, the runner and the sampler stay the one mechanism: a request with k proposals is a
query of 1 + k tokens. Nothing here imports the engine: the engine hands in plain lists and
tensors."""
from __future__ import annotations

from kvserve.backend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "NgramProposer": ".ngram_proposer",
    "SpecDecodeCounters": ".speculator",
    "SpeculativeConfig": ".spec_config",
    "SuffixProposer": ".suffix_proposer",
    "SuffixTree": ".suffix_tree",
    "Speculator": ".speculator",
    "LoadPolicy": ".spec_policy",
    "needs_position_state": ".speculator",
    "parse_speculative_config": ".spec_config",
    "verify_proposals": ".rejection_sampler",
    "verify_with_draft_probs": ".rejection_sampler",
    "DraftModel": ".draft_model",
    "load_draft": ".draft_model",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
