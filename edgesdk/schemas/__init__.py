"""pydantic v2 models: the single source of truth for every edgesdk document.

Names are imported on first use (PEP 562), so that a module needing one schema (the bundle
manifest on a device) does not build all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesdk.schemas.agent_config import AgentConfig
    from edgesdk.schemas.base import SCHEMA_VERSION, Schema
    from edgesdk.schemas.common import PRECISION_LADDER, ModelFormat, Precision, RuntimeName
    from edgesdk.schemas.data_spec import DataSpec
    from edgesdk.schemas.enrollment import EnrollmentRegistry
    from edgesdk.schemas.image import ImageManifest
    from edgesdk.schemas.manifest import BundleManifest, TensorSpec, Variant
    from edgesdk.schemas.messages import (
        CommandRefusal,
        Deployment,
        EnrollRequest,
        Event,
        MqttCredentials,
        OtaStatus,
        Presence,
        Telemetry,
    )
    from edgesdk.schemas.profile import DeviceProfile
    from edgesdk.schemas.report import ConversionReport
    from edgesdk.schemas.trust import TrustDocument

    EXPORTED_SCHEMAS: dict[str, type[Schema]]

#: name → module, for the names this package re-exports.
_LAZY = {
    "AgentConfig": "agent_config",
    "SCHEMA_VERSION": "base",
    "Schema": "base",
    "PRECISION_LADDER": "common",
    "ModelFormat": "common",
    "Precision": "common",
    "RuntimeName": "common",
    "DataSpec": "data_spec",
    "EnrollmentRegistry": "enrollment",
    "ImageManifest": "image",
    "BundleManifest": "manifest",
    "TensorSpec": "manifest",
    "Variant": "manifest",
    "CommandRefusal": "messages",
    "Deployment": "messages",
    "EnrollRequest": "messages",
    "Event": "messages",
    "MqttCredentials": "messages",
    "OtaStatus": "messages",
    "Presence": "messages",
    "Telemetry": "messages",
    "DeviceProfile": "profile",
    "ConversionReport": "report",
    "TrustDocument": "trust",
}

#: Every document that gets a JSON Schema file from ``edgesdk schema export`` (name → class name).
_EXPORTED = {
    "device-profile": "DeviceProfile",
    "bundle-manifest": "BundleManifest",
    "agent-config": "AgentConfig",
    "mqtt-presence": "Presence",
    "mqtt-telemetry": "Telemetry",
    "mqtt-event": "Event",
    "mqtt-deployment": "Deployment",
    "mqtt-ota-status": "OtaStatus",
    "mqtt-command-refusal": "CommandRefusal",
    "conversion-report": "ConversionReport",
    "mqtt-enroll-request": "EnrollRequest",
    "mqtt-credentials": "MqttCredentials",
    "enrollment-registry": "EnrollmentRegistry",
    "image-manifest": "ImageManifest",
    "trust-document": "TrustDocument",
    "data-spec": "DataSpec",
}

__all__ = [
    "EXPORTED_SCHEMAS",
    "PRECISION_LADDER",
    "SCHEMA_VERSION",
    "AgentConfig",
    "BundleManifest",
    "CommandRefusal",
    "ConversionReport",
    "DataSpec",
    "Deployment",
    "DeviceProfile",
    "EnrollRequest",
    "EnrollmentRegistry",
    "Event",
    "ImageManifest",
    "ModelFormat",
    "MqttCredentials",
    "OtaStatus",
    "Precision",
    "Presence",
    "RuntimeName",
    "Schema",
    "Telemetry",
    "TensorSpec",
    "TrustDocument",
    "Variant",
]


def __getattr__(name: str) -> Any:
    if name == "EXPORTED_SCHEMAS":
        value: Any = {doc: __getattr__(cls) for doc, cls in _EXPORTED.items()}
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"edgesdk.schemas.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module 'edgesdk.schemas' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_LAZY))
