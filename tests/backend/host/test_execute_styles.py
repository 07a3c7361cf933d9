"""Other ways a Triton model may answer: through the response sender from a
non-decoupled model, `async def execute`, and contract violations in what
execute returns (reported to the client as Triton reports them)."""
from __future__ import annotations

import queue
import textwrap
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from host_fixtures import HostThread
from tritonclient.utils import InferenceServerException

CONFIG = """
    backend: "python"
    max_batch_size: 0
    {policy}
    input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

MODELS = {
    "via_sender": ("", """
        import numpy as np
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                    out = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)])
                    request.get_response_sender().send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """),
    "async_decoupled": ("model_transaction_policy { decoupled: true }", """
        import asyncio
        import numpy as np
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            async def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                    for k in range(2):
                        await asyncio.sleep(0.01)
                        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + k)]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """),
    "wrong_return": ("", """
        class TritonPythonModel:
            def execute(self, requests):
                return {"not": "a list"}
    """),
    "decoupled_returns": ("model_transaction_policy { decoupled: true }", """
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([]) for _ in requests]
    """),
}


@pytest.fixture(scope="module")
def styles_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root: Path = tmp_path_factory.mktemp("styles")
    for name, (policy, source) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(policy=policy)))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    ht = HostThread(root)
    yield ht.handle
    ht.stop()


def x_input(value: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [x]


def test_non_decoupled_model_may_answer_through_the_sender(styles_host: Any) -> None:
    client = grpcclient.InferenceServerClient(styles_host.grpc_url)
    assert int(client.infer("via_sender", x_input(4)).as_numpy("Y")[0]) == 40


def test_async_execute_of_a_decoupled_model(styles_host: Any) -> None:
    client = grpcclient.InferenceServerClient(styles_host.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("async_decoupled", x_input(5), enable_empty_final_response=True)
    client.stop_stream()
    out = [got.get_nowait() for _ in range(got.qsize())]
    assert [e for _, e in out] == [None, None, None]
    assert [r.as_numpy("Y") is not None and int(r.as_numpy("Y")[0]) for r, _ in out[:2]] == [5, 6]
    assert out[-1][0].get_response().parameters["triton_final_response"].bool_param


def test_execute_return_contract_is_enforced(styles_host: Any) -> None:
    client = grpcclient.InferenceServerClient(styles_host.grpc_url)
    with pytest.raises(InferenceServerException, match=r"Expected a list in the execute return, found type "
                                                        r"'<class 'dict'>'"):
        client.infer("wrong_return", x_input(1))
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("decoupled_returns", x_input(1))
    client.stop_stream()
    _, error = got.get_nowait()
    assert "is using the decoupled mode and the execute function must return None" in str(error)
