"""The gRPC per-message floor: every message arrives, over every stream, and
both sides' CPU per message is reported."""
from __future__ import annotations

import json

from kvserve.loadtests.studies.grpc_message_cost import main


def test_counts_every_message_over_many_streams(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert main(["--messages", "300", "--streams", "7", "--size", "40", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["messages"], doc["streams"], doc["size"]) == (300, 7, 40)
    assert doc["server_cpu_us_per_message"] > 0 and doc["client_cpu_us_per_message"] > 0
    assert "300 messages of 40 bytes on 7 streams" in capsys.readouterr().out


def test_rejects_fewer_messages_than_streams(capsys):
    assert main(["--messages", "3", "--streams", "4"]) == 2
    assert "--streams" in capsys.readouterr().err
