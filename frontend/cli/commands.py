"""`kvserve` command line: each subcommand lives in the module that owns it.

The dispatcher imports a subcommand's module only when it runs, so `kvserve
serve` never pays for torch in the gateway process.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "serve": ("kvserve.frontend.cli.serve_cmd", "one command: embedded Triton host + OpenAI gateway"),
    "triton": ("kvserve.backend.host.server", "run the embedded Triton-compatible host alone"),
    "bench": ("kvserve.loadtests.bench.bench_cli", "serving benchmark against an OpenAI-compatible URL"),
    "pull": ("kvserve.frontend.cli.pull_cmd", "fetch known models (default: SmolLM2-135M-Instruct) into the cache"),
    "make-tiny-model": ("kvserve.backend.models.tiny", "write a small random model in the Hugging Face layout"),
}


def package_version() -> str:
    """kvserve's installed version (GET /version and `kvserve --version` say it)."""
    try:
        from importlib.metadata import version
        return version("kvserve")
    except Exception:  # run from a source tree that was never installed
        return "0.1.0"


def _usage() -> str:
    lines = ["usage: kvserve <command> [options]   (kvserve --version: the version)", "", "commands:"]
    lines += [f"  {name:<16} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-v", "--version"):  # as `vllm --version`
        print(package_version())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"kvserve: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
