"""The gateway learns the context length and served name from the backend: a describe that got no
answer (a timeout while the host was busy) is asked again; an answer, even "cannot tell", is final."""
from __future__ import annotations

import asyncio

from kvserve.frontend.backend_client.protocol import BackendUnavailable, ModelFacts
from kvserve.frontend.http import gateway as gateway_module
from kvserve.frontend.http.gateway import Gateway
from kvserve.frontend.http.gateway_config import GatewayConfig


class _DescribeBackend:
    """Answers describe from a script: an exception is raised, anything else returned."""

    def __init__(self, *answers) -> None:
        self.answers, self.calls = list(answers), 0

    async def ready(self) -> bool:
        return True

    async def describe(self):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _gateway(backend) -> Gateway:
    return Gateway(GatewayConfig(served_model_names=["llm"], learn_served_name=True), backend)


def test_a_describe_lost_in_transport_is_asked_again(monkeypatch) -> None:
    monkeypatch.setattr(gateway_module, "FACTS_RETRY_S", 0.0)
    backend = _DescribeBackend(BackendUnavailable("timeout"), ModelFacts(96, "tiny-remote"))
    gw = _gateway(backend)

    async def run() -> None:
        await gw.learn_model_facts()
        assert not gw.facts_asked and gw.config.max_model_len is None  # nothing learned, nothing given up
        await gw.ensure_ready()  # the next request asks again
    asyncio.run(run())
    assert backend.calls == 2 and gw.facts_asked
    assert gw.config.max_model_len == 96 and gw.config.served_model_names == ["tiny-remote"]


def test_requests_do_not_each_wait_on_a_failing_describe() -> None:
    backend = _DescribeBackend(BackendUnavailable("timeout"), ModelFacts(96, "tiny-remote"))
    gw = _gateway(backend)

    async def run() -> None:
        await gw.learn_model_facts()
        for _ in range(3):
            await gw.ensure_ready()  # within FACTS_RETRY_S: served on the flags' facts, not asked
    asyncio.run(run())
    assert backend.calls == 1 and not gw.facts_asked


def test_the_start_up_loop_keeps_asking_until_answered() -> None:
    backend = _DescribeBackend(BackendUnavailable("timeout"), BackendUnavailable("timeout"), ModelFacts(80, None))
    gw = _gateway(backend)
    asyncio.run(asyncio.wait_for(gw.learn_model_facts_when_ready(interval_s=0.0), 5))
    assert backend.calls == 3 and gw.config.max_model_len == 80 and gw.config.served_model_names == ["llm"]


def test_a_backend_that_cannot_tell_is_not_asked_again() -> None:
    backend = _DescribeBackend(None)
    gw = _gateway(backend)

    async def run() -> None:
        await gw.learn_model_facts()
        await gw.ensure_ready()
    asyncio.run(run())
    assert backend.calls == 1 and gw.facts_asked and gw.config.max_model_len is None


def test_listing_models_learns_the_facts_of_a_ready_backend_first() -> None:
    """/v1/models right after start-up, before the start-up loop's first ask, names the backend's model."""
    backend = _DescribeBackend(ModelFacts(96, "tiny-remote"))
    gw = _gateway(backend)
    asyncio.run(gw.learn_model_facts_if_ready())
    assert gw.config.served_model_names == ["tiny-remote"] and gw.config.max_model_len == 96
    asyncio.run(gw.learn_model_facts_if_ready())
    assert backend.calls == 1
