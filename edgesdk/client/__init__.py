"""Clients for a device agent's local API: ``AgentClient`` (blocking) and ``AsyncAgentClient``.

Host and application side: nothing here imports ``edgesdk.agent``, and nothing beyond the
standard library and numpy is needed (no httpx), so an application on the device can use it
next to the agent. See ``docs/python-api.md``::

    from edgesdk import AgentClient

    with AgentClient("http://127.0.0.1:8470") as agent:
        logits = agent.infer("digits", images)["logits"]
"""

from edgesdk.client.async_client import AsyncAgentClient
from edgesdk.client.sync_client import AgentClient
from edgesdk.client.wire import InferenceOutputs

__all__ = ["AgentClient", "AsyncAgentClient", "InferenceOutputs"]
