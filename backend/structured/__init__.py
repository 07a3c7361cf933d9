"""Structured outputs: what a constraint is (spec), how it is compiled (compiler,
off the engine thread, cached) and how it steers decoding (matchers, owned by the engine)."""
