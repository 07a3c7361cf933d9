"""Several backends behind one `BackendClient` (`kvserve serve --triton-url A --triton-url B`,
`dns://NAME:PORT`, `--triton-urls-file FILE`): where the list comes from (sources.py), which
replica gets a request (routing.py over routing_key.py's prefix key), the set itself and its
failover (replica_set.py), its flags (flags.py), the router's metrics (router_metrics.py) and the
replicas' merged /metrics text (metrics_merge.py)."""
