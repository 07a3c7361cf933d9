"""Benchmarks of speculative decoding served over HTTP (issue 32)."""
