"""`kvserve pull [NAME ...]`: fetch known models into the cache without serving them.

For images and CI caches: once pulled, `kvserve serve --model NAME` (or with no
--model, the default chat model) starts with no network. A GGUF model's
tokenizer files for the gateway are exported here too, so the first start does
not pay for that either.
"""
from __future__ import annotations

import argparse
import sys

from kvserve.frontend.cli.default_model import DEFAULT_MODEL_NAME, ensure_known_model, gateway_model_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvserve pull", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=[DEFAULT_MODEL_NAME],
                        help=f"known model names (default: {DEFAULT_MODEL_NAME}; also all-MiniLM-L6-v2)")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            path = ensure_known_model(name)
            if path.suffix == ".gguf":
                gateway_model_dir(path)
            print(f"{name} {path}", flush=True)
    except (RuntimeError, OSError) as exc:
        print(f"kvserve pull: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
