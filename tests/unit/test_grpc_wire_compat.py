"""The agent's own Open Inference Protocol messages (agent/api/open_inference_v2.proto) speak
the same wire format as the official client: every field the agent uses has the name, number,
type and cardinality of tritonclient's generated ``inference`` messages (a superset of KServe's).
And a device without the grpc extra never loads grpc: the daemon imports it only when
``api.grpc.enabled``."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("google.protobuf", reason="protobuf (the grpc extra) not installed")
triton_pb = pytest.importorskip(
    "tritonclient.grpc.service_pb2", reason="tritonclient[grpc] (the dev extra) not installed"
)
from edgesdk.agent.api import open_inference_v2_pb2 as ours  # noqa: E402 - after the skips above

MESSAGES = [
    "ServerLiveRequest",
    "ServerLiveResponse",
    "ServerReadyRequest",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataRequest",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "ModelInferRequest",
    "ModelInferResponse",
    "InferParameter",
    "InferTensorContents",
]


def fields(descriptor) -> dict[str, tuple]:
    """Field name → (number, type, repeated, message type's short name), nested messages too."""
    found = {}
    for field in descriptor.fields:
        message = field.message_type.name if field.message_type is not None else None
        found[f"{descriptor.name}.{field.name}"] = (field.number, field.type, field.is_repeated, message)
        if field.message_type is not None and field.message_type.containing_type is descriptor:
            found.update(fields(field.message_type))
    return found


@pytest.mark.parametrize("name", MESSAGES)
def test_every_field_matches_tritonclients(name: str) -> None:
    mine = fields(getattr(ours, name).DESCRIPTOR)
    theirs = fields(getattr(triton_pb, name).DESCRIPTOR)
    assert not mine or set(mine) <= set(theirs), sorted(set(mine) - set(theirs))
    assert {key: theirs.get(key) for key in mine} == mine


def test_a_request_written_by_tritonclient_reads_back_in_ours() -> None:
    sent = triton_pb.ModelInferRequest(model_name="digits", model_version="1", id="r1")
    tensor = sent.inputs.add(name="image", datatype="FP32", shape=[1, 2])
    tensor.parameters["p"].int64_param = 7
    sent.outputs.add(name="logits").parameters["binary_data"].bool_param = True
    sent.raw_input_contents.append(b"\x00" * 8)
    got = ours.ModelInferRequest.FromString(sent.SerializeToString())
    assert (got.model_name, got.model_version, got.id) == ("digits", "1", "r1")
    assert list(got.inputs[0].shape) == [1, 2] and got.inputs[0].parameters["p"].int64_param == 7
    assert got.outputs[0].parameters["binary_data"].bool_param is True
    assert list(got.raw_input_contents) == [b"\x00" * 8]


def test_the_daemon_and_the_http_api_never_import_grpc() -> None:
    code = (
        "import sys, edgesdk.agent.daemon, edgesdk.agent.api.app, edgesdk.agent.api.open_inference;"
        "loaded = [m for m in ('grpc', 'google.protobuf') if m in sys.modules]; print(loaded); sys.exit(bool(loaded))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
