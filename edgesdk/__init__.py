"""edgesdk: package trained models for edge devices, run them offline, update fleets.

The public surface is small on purpose; everything else lives in submodules:

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
    from edgesdk.profiles import get_profile, load_profiles

_LAZY = {"get_profile": "edgesdk.profiles", "load_profiles": "edgesdk.profiles"}

__all__ = ["EdgeSDKError", "__version__", "get_profile", "load_profiles"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgesdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
