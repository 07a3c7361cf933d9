"""The gateway's side of the gRPC seam: `protocol` (the contract between the routes and whatever
runs the model), the tritonclient BackendClient and its codec, the embed client, fan-out of one
call's prompts, readiness, the tracing seam, and replicas/ (several backends behind one client)."""
from __future__ import annotations

from kvserve.frontend import exports_loader

# Public names -> the module that defines them. Sibling packages import only these names
# (tests/contract/test_import_rules.py), and each loads on first use.
_EXPORTS = {
    "BackendClient": ".protocol",
    "BackendError": ".protocol",
    "BackendFailed": ".protocol",
    "BackendRejected": ".protocol",
    "BackendUnavailable": ".protocol",
    "ChoiceDelta": ".protocol",
    "EmbedRequest": ".protocol",
    "EmbedResult": ".protocol",
    "EmbeddingBackend": ".protocol",
    "EngineControl": ".protocol",
    "Fanout": ".fanout",
    "GenerateRequest": ".protocol",
    "LoRAAdapterInfo": ".protocol",
    "LoRAControl": ".protocol",
    "ModelFacts": ".protocol",
    "ReadinessCache": ".readiness",
    "ServerSpan": ".tracing_seam",
    "ShuttingDown": ".protocol",
    "TokenLogprob": ".protocol",
    "TopLogprob": ".protocol",
    "TritonBackendClient": ".triton_client",
    "TritonEmbeddingClient": ".embed_client",
    "UNMATCHED_ROUTE": ".tracing_seam",
    "add_replica_flags": ".replicas.flags",
    "annotate_embeddings": ".tracing_seam",
    "annotate_request": ".tracing_seam",
    "annotate_response": ".tracing_seam",
    "backend_traceparent": ".tracing_seam",
    "build_backend": ".replicas.flags",
    "is_dns_url": ".replicas.sources",
    "is_remote": ".replicas.flags",
    "positive_number": ".replicas.flags",
    "start_server_span": ".tracing_seam",
    "validate_replica_flags": ".replicas.flags",
}
__all__ = sorted(_EXPORTS)
__getattr__ = exports_loader(__name__, _EXPORTS)
