"""`kvserve triton` / `python -m kvserve.backend.host`: run the embedded host.

Prints exactly one line, `kvserve-host ready grpc=HOST:PORT metrics=HOST:PORT`,
on stdout once every model has finished initialize (a parent process waits for
it), and exits 0 after a clean shutdown on SIGTERM/SIGINT or when the process
given by --parent-pid dies. A model that fails to load makes it exit 1 without
that line (tritonserver's --exit-on-error, on by default), so `kvserve serve`
stops with the error instead of serving 503s from a host that cannot recover.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TextIO

from .host import start_host
from .model_runtime import ModelState
from .parent_watch import watch_parent

_LOG = logging.getLogger("kvserve.host")
_LEVELS = {"verbose": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
           "warning": logging.WARNING, "error": logging.ERROR}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvserve triton",
                                description="Serve a Triton model repository of Python-backend models "
                                            "over KServe v2 gRPC, as tritonserver would.")
    p.add_argument("--model-repository", required=True, help="folder of <model>/config.pbtxt + <version>/model.py")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=None,
                   help="HTTP port for /metrics and /v2/health/{live,ready} (default: the gRPC port + 1, "
                        "8002 beside tritonserver's 8001, and where a gateway's --triton-url looks)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process dies")
    p.add_argument("--strict-readiness", type=_bool, default=True,
                   help="ready only when every model loaded (tritonserver's default)")
    p.add_argument("--exit-on-error", type=_bool, default=True,
                   help="exit (code 1, no ready line) when a model fails to load (tritonserver's default)")
    p.add_argument("--model-control-mode", choices=("none", "explicit"), default="none",
                   help="none: load every model in the repository; explicit: only those named by --load-model, "
                        "and clients may load and unload models (tritonserver's flags)")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="with --model-control-mode=explicit, a model to load at startup (repeat; '*' for all)")
    p.add_argument("--log-level", default="info", type=str.lower, choices=sorted(_LEVELS))
    return p


def _load_models(args: argparse.Namespace) -> frozenset[str] | None:
    if args.model_control_mode == "none" or "*" in args.load_model:
        return None
    return frozenset(args.load_model)


def _configure_logging(level: str) -> None:
    # kvserve's structlog setup: JSON lines on stderr (KVSERVE_LOG_FORMAT=console for
    # humans), so the models' request lines carry request_id and trace_id fields.
    from kvserve.observability.logging import configure_logging
    configure_logging(level=_LEVELS[level], stream=sys.stderr)


def _reserve_stdout() -> TextIO:
    """A private handle on the real stdout, with fd 1 pointed at stderr.

    model.py files print freely (Triton's own examples print from initialize);
    their output must never be taken for the ready line a parent process waits
    for, so everything else written to stdout, from Python or C, goes to stderr.
    """
    try:
        sys.stdout.flush()
        private = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        return private
    except (OSError, ValueError):
        return sys.stdout


async def _serve(args: argparse.Namespace, ready_out: TextIO) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch_parent(args.parent_pid, stop.set)) if args.parent_pid else None

    starting = asyncio.create_task(start_host(args.model_repository, grpc_port=args.grpc_port,
                                              metrics_port=args.metrics_port, host=args.host,
                                              strict_readiness=args.strict_readiness,
                                              load_models=_load_models(args),
                                              explicit_model_control=args.model_control_mode == "explicit"))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # initialize() runs in threads that cannot be interrupted; waiting for a
        # large model to finish loading would let the host outlive its parent.
        _LOG.warning("stop requested while models were loading: exiting without finalize")
        logging.shutdown()
        os._exit(0)
    try:
        handle = starting.result()
    except OSError as exc:  # a port taken (or not ours to bind): say which, and exit 1
        _LOG.error("cannot start: %s", exc)
        return 1
    if args.exit_on_error and not handle.repository.all_ready():
        failed = sorted({name for name, _, state, _ in handle.repository.index()
                         if state != ModelState.READY.value})
        _LOG.error("exiting: %s failed to load (the reason is logged above; --exit-on-error=false serves the "
                   "others)", ", ".join(failed))
        await handle.stop(grace=0)
        return 1
    print(f"kvserve-host ready grpc={handle.host}:{handle.grpc_port} metrics={handle.host}:{handle.metrics_port}",
          file=ready_out, flush=True)
    await stopping
    _LOG.info("shutting down")
    await handle.stop()
    if watcher is not None:
        watcher.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.metrics_port is None:
        # One flag moves both ports: two hosts started with only --grpc-port no longer collide on 8002.
        args.metrics_port = args.grpc_port + 1 if args.grpc_port else 0
    _configure_logging(args.log_level)
    ready_out = _reserve_stdout()
    try:
        return asyncio.run(_serve(args, ready_out))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
