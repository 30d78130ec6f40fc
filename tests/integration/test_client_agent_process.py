"""edgesdk.AgentClient and AsyncAgentClient against a real ``edge-agent run`` serving a real digits
bundle, over TCP and over its Unix socket: outputs equal onnxruntime's, errors are typed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from edgesdk import AgentClient, AsyncAgentClient
from edgesdk.errors import AgentInputError, AgentNotFoundError
from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def agent(digits, request, tmp_path_factory):
    from tests.bundle_helpers import make_digits_convert_dir

    convert_dir = make_digits_convert_dir(
        digits, Path(request.config.cache.mkdir("edgesdk-agent-digits-convert-v1")) / "out"
    )
    root = tmp_path_factory.mktemp("client")
    device = make_device(root)
    device.write_config(api={"unix_socket": str(root / "agent.sock")})
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


@pytest.fixture(scope="module")
def images_and_reference(images, reference):
    return images, reference


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_sync_client_matches_the_runtime(agent, images_and_reference, transport) -> None:
    images, reference = images_and_reference
    socket_path = agent.device.root / "agent.sock"
    client = AgentClient(unix_socket=socket_path) if transport == "unix" else AgentClient(agent.url)
    with client:
        assert client.wait_ready(timeout=60)["model"] == "digits"
        assert client.status()["model"]["version"] == "1.0.0"
        assert client.models()[0]["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
        one = client.infer("digits", images)  # one array: the model's only input
        named = client.infer("digits", {"image": images})
        assert one.variant == named.variant == "onnx-fp32"
        np.testing.assert_allclose(one["logits"], reference, atol=1e-5)
        np.testing.assert_array_equal(one["logits"], named["logits"])
        with pytest.raises(AgentInputError) as caught:
            client.infer("digits", images[..., :7])
        assert caught.value.status == 422 and "axis 3 must be 8" in caught.value.detail
        with pytest.raises(AgentNotFoundError):
            client.infer("cats", images)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_async_client_matches_the_runtime(agent, images_and_reference, transport) -> None:
    images, reference = images_and_reference
    socket_path = agent.device.root / "agent.sock"

    async def main() -> None:
        client = AsyncAgentClient(unix_socket=socket_path) if transport == "unix" else AsyncAgentClient(agent.url)
        async with client:
            await client.wait_ready(timeout=60)
            answers = await asyncio.gather(*(client.infer("digits", images[i : i + 2]) for i in range(0, 8, 2)))
            logits = np.concatenate([a["logits"] for a in answers])
            np.testing.assert_allclose(logits, reference, atol=1e-5)

    asyncio.run(main())
