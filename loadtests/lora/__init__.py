"""Benchmarks of multi-LoRA serving (issue 33): lora_ab over HTTP, lora_decode_ab offline decode steps."""
