# Decoupled model: IN=n streams n responses (OUT=n, IDX=0..n-1) from a
# background thread, checking is_cancelled() before each send. The last data
# response carries FINAL when FINAL_WITH_DATA is true; otherwise a flags-only
# FINAL follows. IN=-1 answers with an error response, IN=-2 makes execute
# raise. Counters record cancellations and that a send after FINAL is refused.
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        labels = {"model": args["model_name"]}
        self.cancelled = pb_utils.MetricFamily(
            "repeat_cancelled_total", "Requests that saw is_cancelled()", pb_utils.MetricFamily.COUNTER
        ).Metric(labels=labels)
        self.refused = pb_utils.MetricFamily(
            "repeat_send_after_final_refused_total", "Sends after FINAL that raised", pb_utils.MetricFamily.COUNTER
        ).Metric(labels=labels)
        self.active = pb_utils.MetricFamily(
            "repeat_active", "Requests being streamed", pb_utils.MetricFamily.GAUGE
        ).Metric(labels=labels)
        self.stop = threading.Event()
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n == -2:
                raise RuntimeError("repeat was asked to raise")
            delay_t = pb_utils.get_input_tensor_by_name(request, "DELAY")
            final_t = pb_utils.get_input_tensor_by_name(request, "FINAL_WITH_DATA")
            delay = float(delay_t.as_numpy()[0]) if delay_t is not None else 0.0
            final_with_data = bool(final_t.as_numpy()[0]) if final_t is not None else False
            thread = threading.Thread(
                target=self.stream, args=(request, request.get_response_sender(), n, delay, final_with_data),
                daemon=True)
            thread.start()
            self.threads.append(thread)
        return None

    def stream(self, request, sender, n, delay, final_with_data):
        self.active.increment(1)
        try:
            if n == -1:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative count", pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
                return
            for i in range(n):
                if sender.is_cancelled() or request.is_cancelled() or self.stop.is_set():
                    self.cancelled.increment(1)
                    sender.send(flags=FINAL)  # Triton requires FINAL even after cancellation
                    return
                response = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([n], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.int32)),
                ])
                last = i == n - 1
                sender.send(response, flags=FINAL if (last and final_with_data) else 0)
                if delay:
                    time.sleep(delay)
            if not final_with_data or n == 0:
                sender.send(flags=FINAL)
            try:
                sender.send(flags=FINAL)
            except pb_utils.TritonModelException as exc:
                if "Response sender has been closed" in str(exc):
                    self.refused.increment(1)
        finally:
            self.active.increment(-1)

    def finalize(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
