"""pydantic v2 models: the single source of truth for every edgesdk document."""

from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.common import PRECISION_LADDER, ModelFormat, Precision, RuntimeName
from edgesdk.schemas.enrollment import EnrollmentRegistry
from edgesdk.schemas.image import ImageManifest
from edgesdk.schemas.manifest import BundleManifest, TensorSpec, Variant
from edgesdk.schemas.messages import Deployment, EnrollRequest, Event, OtaStatus, Presence, Telemetry
from edgesdk.schemas.profile import DeviceProfile
from edgesdk.schemas.report import ConversionReport

#: Every document that gets a JSON Schema file from ``edgesdk schema export``.
EXPORTED_SCHEMAS: dict[str, type[Schema]] = {
    "device-profile": DeviceProfile,
    "bundle-manifest": BundleManifest,
    "agent-config": AgentConfig,
    "mqtt-presence": Presence,
    "mqtt-telemetry": Telemetry,
    "mqtt-event": Event,
    "mqtt-deployment": Deployment,
    "mqtt-ota-status": OtaStatus,
    "conversion-report": ConversionReport,
    "mqtt-enroll-request": EnrollRequest,
    "enrollment-registry": EnrollmentRegistry,
    "image-manifest": ImageManifest,
}

__all__ = [
    "EXPORTED_SCHEMAS",
    "PRECISION_LADDER",
    "SCHEMA_VERSION",
    "AgentConfig",
    "BundleManifest",
    "ConversionReport",
    "Deployment",
    "DeviceProfile",
    "Event",
    "ModelFormat",
    "OtaStatus",
    "Precision",
    "Presence",
    "RuntimeName",
    "Schema",
    "Telemetry",
    "TensorSpec",
    "Variant",
]
