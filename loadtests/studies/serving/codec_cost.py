"""CPU microseconds per streamed token of the serving path's own Python, piece by piece, in one
process (no server): what the respond thread builds and encodes, and what the gateway parses.

    python -m kvserve.loadtests.studies.serving.codec_cost [--rounds 3] [--logprobs K]

Each figure is thread CPU time (time.thread_time) over 20,000 calls after a warm-up: a busy machine
inflates it less than wall-clock time. Run it on two checkouts to compare them; both host paths
(the message path and, where the checkout has it, stream_wire's bytes) are timed side by side.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

from tritonclient.grpc import service_pb2 as pb

from kvserve.backend.engine import CompletionOutput, TokenLogprob
from kvserve.backend.host import pb_utils
from kvserve.backend.host.kserve.codec import encode_response
from kvserve.backend.triton.model_tensors import ChoiceTotals, choice_tensors
from kvserve.frontend.backend_client.grpc_codec import parse_response

_RID = "chatcmpl-0123456789abcdef0123456789abcdef-0-1"


def _cpu_us(fn: Callable[[], object], calls: int = 20_000) -> float:
    for _ in range(500):
        fn()
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return 1e6 * (time.thread_time() - start) / calls


def pieces(logprobs: int | None) -> dict[str, Callable[[], object]]:
    entries = None if logprobs is None else [TokenLogprob(1234, -0.5, [(1234, -0.5)] * logprobs)]
    choice = CompletionOutput(index=0, text=" hello", token_ids=[1234], finish_reason=None, logprobs=entries)
    totals = ChoiceTotals(completion_tokens=5)

    def build() -> pb_utils.InferenceResponse:  # the respond thread's part in model_tensors
        return pb_utils.InferenceResponse(output_tensors=choice_tensors(pb_utils, choice, totals, 15, 0, logprobs))

    response = build()

    def message_path() -> bytes:  # codec.encode_response, the stream's FINAL flag, serialised
        message = encode_response(response, model_name="llm", model_version="1", request_id=_RID,
                                  requested_outputs=None)
        message.parameters["triton_final_response"].bool_param = False
        return pb.ModelStreamInferResponse(infer_response=message).SerializeToString()

    out = {"respond: build the tensors": build, "host: encode, message path": message_path}
    try:
        from kvserve.backend.host.kserve.stream_wire import encode_stream_response, id_field
    except ImportError:  # a checkout from before stream_wire
        pass
    else:
        id_wire = id_field(_RID)
        out["host: encode, stream_wire bytes"] = lambda: encode_stream_response(
            response, model_name="llm", model_version="1", request_id=_RID, id_wire=id_wire,
            requested_outputs=None, final=False)
    wire = message_path()
    out["gateway: FromString"] = lambda: pb.ModelStreamInferResponse.FromString(wire)
    received = pb.ModelStreamInferResponse.FromString(wire).infer_response
    out["gateway: parse_response"] = lambda: parse_response(received)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.serving.codec_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--logprobs", type=int, default=None, help="k top logprobs per token (default: none)")
    opts = p.parse_args(argv)
    named = pieces(opts.logprobs)
    results: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(opts.rounds):  # interleaved: a busy spell touches every piece alike
        for name, fn in named.items():
            results[name].append(_cpu_us(fn))
    for name, values in results.items():
        print(f"{name:36s} " + " ".join(f"{v:6.1f}" for v in values) + "  us CPU per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
