"""edgesdk: package trained models for edge devices, run them offline, update fleets.

The public surface is small on purpose; everything else lives in submodules:

- :mod:`edgesdk.schemas`  - pydantic models for every document
- :mod:`edgesdk.profiles` - device profiles (``get_profile``, ``load_profiles``)
- :mod:`edgesdk.errors`   - the error hierarchy rooted at ``EdgeSDKError``
- ``edgesdk.agent``       - the device daemon (``pip install 'edgesdk[agent]'``)
- ``edgesdk.converters``  - the host toolchain (``pip install 'edgesdk[convert]'``)
"""

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError
from edgesdk.profiles import get_profile, load_profiles

__all__ = ["EdgeSDKError", "__version__", "get_profile", "load_profiles"]
