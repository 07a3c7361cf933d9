"""vLLM's beam search (`use_beam_search`, `length_penalty`), run by the gateway over the engine as
vLLM runs it: each step asks the engine for one token of every live beam, with twice the beam
width of top logprobs, and keeps the best `n` of what they grow into. The prefix cache makes a
step cost about one decode token per beam; the engine needs nothing of its own for it."""
