"""kvserve.seam: the facts both sides of the gRPC seam must agree on, written once.

The gateway (kvserve.frontend), the model adapter (kvserve.backend.triton.triton_model,
which model.py runs inside a real tritonserver) and config.pbtxt all read them
from here; tests/contract/ checks that they agree. A leaf: only the standard
library, so the gateway can import it without pulling in the engine (torch).

- `tensors`: input/output tensor names and the request parameters;
- `embed_tensors`: the same for the embed model (model_repository/embed);
- `error_wire`: `ErrorKind` and the one parseable error-message format;
- `limits`: the request limits both sides enforce;
- `tokenizer`: the model's tokenizer both sides read (the one module that imports a third-party
  package, `tokenizers`; nothing above imports it).
"""
