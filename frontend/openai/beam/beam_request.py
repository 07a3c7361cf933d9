"""vLLM's beam search fields on completions and chat: `use_beam_search`, `length_penalty`.

Beam search reads `n` (the beam width), `max_tokens`, `ignore_eos`, `temperature`,
`include_stop_str_in_output`, `skip_special_tokens` and `logprobs`, as vLLM's does. A field
that changes which token comes next (stop strings, penalties, top-p, a grammar ...) would be
ignored by it, so a request that sets one to anything but its default is refused, naming it.
"""
from __future__ import annotations

from typing import Any

from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import bad_request
from kvserve.seam.limits import MAX_LOGPROBS

MAX_BEAM_WIDTH = MAX_LOGPROBS // 2  # each step asks for twice the width of top logprobs
# sampling fields beam search would ignore -> their defaults (absent counts as the default)
_IGNORED = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "top_p": 1.0,
            "top_k": -1, "min_p": 0.0, "min_tokens": 0}
_IGNORED_WHEN_SET = ("stop", "stop_token_ids", "bad_words", "allowed_token_ids", "logit_bias",
                     "truncate_prompt_tokens", "prompt_logprobs")


def beam_length_penalty(body: dict[str, Any], sampling: dict[str, Any], constrained: bool) -> float | None:
    """The length penalty of a beam search request; None when the request does not ask for one."""
    if not F.opt_bool(body, "use_beam_search"):
        for name in ("length_penalty", "early_stopping"):
            if body.get(name) not in (None, False) and not (name == "length_penalty" and body[name] == 1.0):
                raise bad_request(f"'{name}' is a beam search setting: it needs 'use_beam_search'", param=name)
        return None
    if F.opt_bool(body, "early_stopping"):
        raise bad_request("'early_stopping' is not implemented: beam search runs max_tokens steps, as vLLM's",
                          param="early_stopping")
    penalty = F.opt_number(body, "length_penalty")
    if sampling.get("n", 1) > MAX_BEAM_WIDTH:
        raise bad_request(f"'n' (the beam width) must not exceed {MAX_BEAM_WIDTH} with 'use_beam_search'", param="n")
    if constrained:
        raise _ignored("structured outputs")
    for name in _IGNORED_WHEN_SET:
        if sampling.get(name) not in (None, [], {}):
            raise _ignored(name)
    for name, default in _IGNORED.items():
        if sampling.get(name, default) != default:
            raise _ignored(name)
    return 1.0 if penalty is None else penalty


def _ignored(name: str):
    return bad_request(f"'{name}' cannot be combined with 'use_beam_search': beam search would ignore it",
                       param=name)
