"""`kvserve serve` flags for routing between replicas, and the `BackendClient`
they describe (one Triton client, or a `ReplicaSet` over several)."""
from __future__ import annotations

import argparse

from kvserve.frontend.backend_client.protocol import BackendClient
from kvserve.frontend.backend_client.replicas.replica_set import ReplicaSet
from kvserve.frontend.backend_client.replicas.routing import RoutingPolicy
from kvserve.frontend.backend_client.replicas.routing_key import DEFAULT_BLOCK_SIZE, PrefixKey
from kvserve.frontend.backend_client.replicas.sources import Target, default_metrics_url, is_dns_url, sources_from_flags
from kvserve.frontend.backend_client.triton_client import TritonBackendClient
from kvserve.seam.tokenizer import ModelTokenizer


def positive_number(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas (with --triton-url / --triton-urls-file)")
    g.add_argument("--triton-urls-file", metavar="FILE",
                   help="replicas one per line (`GRPC_URL [METRICS_URL]`, # comments, dns:// allowed); "
                        "re-read when it changes")
    g.add_argument("--replica-health-interval", type=positive_number, default=2.0, metavar="S",
                   help="seconds between ServerReady/ModelReady checks of each replica")
    g.add_argument("--replica-discovery-interval", type=positive_number, default=5.0, metavar="S",
                   help="seconds between re-resolving dns://NAME:PORT urls and checking the urls file")
    g.add_argument("--prefix-affinity", action=argparse.BooleanOptionalAction, default=True,
                   help="send requests whose first prompt block is the same to the same replica (its prefix cache)")
    g.add_argument("--affinity-load-factor", type=float, default=2.0, metavar="F",
                   help="affinity yields when its replica has more than F x min + SLACK requests outstanding")
    g.add_argument("--affinity-load-slack", type=int, default=4, metavar="SLACK",
                   help="see --affinity-load-factor")


def is_remote(args: argparse.Namespace) -> bool:
    return bool(args.triton_url or args.triton_urls_file)


def validate_replica_flags(args: argparse.Namespace) -> None:
    """ValueError on flag values that can only be mistakes (before anything starts)."""
    RoutingPolicy(args.prefix_affinity, args.affinity_load_factor, args.affinity_load_slack)
    fixed = [u for u in args.triton_url if not is_dns_url(u)]
    if len(args.triton_metrics_url) > len(fixed):
        raise ValueError("more --triton-metrics-url than fixed --triton-url values")
    sources_from_flags(args.triton_url, args.triton_metrics_url, None)  # HOST:PORT / dns://NAME:PORT syntax


def build_backend(args: argparse.Namespace, tokenizer: ModelTokenizer | None) -> BackendClient:
    """One `--triton-url HOST:PORT`: that client alone. Anything more (several
    urls, dns://, a urls file): a ReplicaSet that routes and health-checks."""
    def client(target: Target) -> TritonBackendClient:
        return TritonBackendClient(target.grpc_url, model_name=args.triton_model_name,
                                   metrics_url=target.metrics_url or default_metrics_url(target.grpc_url))

    urls = list(args.triton_url)
    if len(urls) == 1 and not args.triton_urls_file and not is_dns_url(urls[0]):
        metrics = args.triton_metrics_url[0] if args.triton_metrics_url else None
        return client(Target(urls[0], metrics))
    policy = RoutingPolicy(args.prefix_affinity, args.affinity_load_factor, args.affinity_load_slack)
    block_size = getattr(args, "block_size", None) or DEFAULT_BLOCK_SIZE
    sources = sources_from_flags(urls, args.triton_metrics_url, args.triton_urls_file)
    return ReplicaSet(sources=sources, client_factory=client, policy=policy,
                      prefix_key=PrefixKey(tokenizer, block_size),
                      health_interval=args.replica_health_interval,
                      discovery_interval=args.replica_discovery_interval,
                      display_name=",".join(urls + ([args.triton_urls_file] if args.triton_urls_file else [])))
