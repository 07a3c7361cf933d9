"""`kvserve bench`: the serving benchmark (datasets, pacing, the streaming client, vLLM's metrics,
report and plot), the locustfile and the soak test. Installed: `kvserve bench` is a product command."""
