"""Benchmarks of multi-LoRA serving over HTTP (issue 33)."""
