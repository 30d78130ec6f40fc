"""edgesdk: package trained models for edge devices, run them offline, update fleets.

The public surface is small on purpose (see ``docs/python-api.md``)::

    edgesdk.convert(model, profile, out=...) -> ConversionReport     a model -> validated artifacts
    edgesdk.package(report_or_dir, version=..., ...) -> Path         -> one signed, encrypted bundle
    edgesdk.verify_bundle(path, trusted_publishers=...)              check it as a device would
    edgesdk.load_profile(name_or_path) -> DeviceProfile
    edgesdk.AgentClient(url) / edgesdk.AsyncAgentClient(url)         a device agent's local API

Everything else lives in submodules:

- :mod:`edgesdk.schemas`  - pydantic models for every document
- :mod:`edgesdk.profiles` - device profiles (``get_profile``, ``load_profiles``)
- :mod:`edgesdk.errors`   - the error hierarchy rooted at ``EdgeSDKError``
- ``edgesdk.agent``       - the device daemon (``pip install 'edgesdk[agent]'``)
- ``edgesdk.converters``  - the host toolchain (``pip install 'edgesdk[convert]'``)

Names are imported on first use (PEP 562): ``import edgesdk.bundle`` on a device must not
pay for building every schema and reading every profile (it is most of a cold start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError

if TYPE_CHECKING:
    from edgesdk.client import AgentClient, AsyncAgentClient
    from edgesdk.profiles import get_profile, load_profiles
    from edgesdk.toolchain import BundleVerification, convert, load_profile, package, verify_bundle

_LAZY = {
    "get_profile": "edgesdk.profiles",
    "load_profiles": "edgesdk.profiles",
    "BundleVerification": "edgesdk.toolchain",
    "convert": "edgesdk.toolchain",
    "load_profile": "edgesdk.toolchain",
    "package": "edgesdk.toolchain",
    "verify_bundle": "edgesdk.toolchain",
    "AgentClient": "edgesdk.client",
    "AsyncAgentClient": "edgesdk.client",
}

__all__ = [
    "AgentClient",
    "AsyncAgentClient",
    "BundleVerification",
    "EdgeSDKError",
    "__version__",
    "convert",
    "get_profile",
    "load_profile",
    "load_profiles",
    "package",
    "verify_bundle",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgesdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
