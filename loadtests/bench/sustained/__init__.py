"""Sustained load: locust users and their load shapes, and the soak test with its constrained
requests (`python -m kvserve.loadtests.bench.sustained.soak`)."""
