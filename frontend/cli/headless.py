"""`kvserve serve --headless`: a node other than the head of a multi-node world (vLLM's flags for its
mp backend: --nnodes, --node-rank, --master-addr, --master-port, --headless). It serves no API: it
becomes the engine's node launcher (`python -m kvserve.backend.worker.parallel.launch`), which starts
this node's ranks and waits for them; the gateway never imports the engine, so it is exec'd. The
other serving flags (ports, API keys, ...) are the head's business and are ignored here, so that the
head's command line can be reused as it is.

The same command line as the head's, plus --headless and another --node-rank:

    head:   kvserve serve M --tensor-parallel-size 3 --nnodes 2 --node-rank 0 --master-addr HEAD_IP
    node 1: kvserve serve M --tensor-parallel-size 3 --nnodes 2 --node-rank 1 --master-addr HEAD_IP --headless
"""
from __future__ import annotations

import argparse
import os
import sys

from kvserve.frontend.cli.default_model import resolve_model


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--headless", action="store_true",
                        help="run this node's ranks of a multi-node world and no API (with --nnodes, "
                             "--node-rank > 0, --master-addr: docs/parallelism.md)")


def check_node_flags(args: argparse.Namespace) -> str | None:
    """What is wrong with the multi-node flags of a head (not --headless), or None."""
    nnodes = args.nnodes or 1
    if args.node_rank not in (None, 0):
        return (f"--node-rank {args.node_rank}: only node 0 serves the API; node {args.node_rank} runs "
                "the same command with --headless")
    if nnodes > 1 and args.triton_url:
        return "--nnodes: the ranks run with this server's engine; with --triton-url there is none"
    return None


def headless_command(args: argparse.Namespace) -> list[str]:
    """The node launcher's command line, without --model; ValueError naming the flag that is missing."""
    if args.master_addr is None:
        raise ValueError("--master-addr: a headless node needs the head's address")
    if args.triton_url:
        raise ValueError("--headless: a headless node runs ranks on this machine; --triton-url has none")
    command = [sys.executable, "-m", "kvserve.backend.worker.parallel.launch",
               "--nnodes", str(args.nnodes or 1), "--node-rank", str(args.node_rank or 0),
               "--world-size", str((args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)),
               "--master-addr", args.master_addr]
    if args.master_port is not None:
        command += ["--master-port", str(args.master_port)]
    if args.cpu_reserved_cores:
        command += ["--cpu-reserved-cores", str(args.cpu_reserved_cores)]
    return command


def run_headless(args: argparse.Namespace) -> int:
    """Exec the node launcher (it checks the numbers and reports its own errors and exit status);
    2 on a usage error found here."""
    try:
        command = headless_command(args)
        # The same name resolves to this node's copy (a known model is fetched into its cache).
        model_path = resolve_model(args.model or args.model_tag)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"kvserve serve: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, command + ["--model", str(model_path.resolve())])
    return 1  # not reached
