"""One-off measurements (off-CPU time, per-thread CPU, gRPC message cost, contention, roofline, KV
waste, ...), each kept to rerun the figure it produced. Not installed (pyproject.toml does not list
this package): run them from a checkout, `python -m kvserve.loadtests.studies.NAME`."""
