"""The base every edgesdk document derives from.

Documents are frozen (a loaded manifest or profile cannot be changed by accident after it
was validated) and reject unknown fields (a typo in a profile is an error, not a silently
ignored key). Each top-level document carries ``schema_version`` so readers can refuse a
document written by a newer edgesdk instead of misreading it.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from edgesdk.errors import SchemaError

SCHEMA_VERSION: Final = 1

T = TypeVar("T", bound="Schema")


class Schema(BaseModel):
    """Frozen, strict base for every edgesdk schema."""

    # defer_build: a model's validator is built on first use, so a process pays only for the
    # documents it handles (the device agent never builds ConversionReport or the fleet's
    # messages unless its MQTT link is on; ~0.5 MB less agent RSS, measured).
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, defer_build=True)

    @classmethod
    def parse_obj_clear(cls: type[T], data: Any, *, source: str) -> T:
        """Validate ``data``; on failure raise one SchemaError naming the source and first field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SchemaError(describe_validation_error(exc, source=source)) from exc

    @classmethod
    def parse_json_clear(cls: type[T], raw: str | bytes, *, source: str) -> T:
        """Parse JSON text and validate it, with the same clear error as ``parse_obj_clear``."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SchemaError(f"{source}: not valid JSON ({exc})") from exc
        return cls.parse_obj_clear(data, source=source)


def describe_validation_error(exc: ValidationError, *, source: str) -> str:
    """One line: where, which field, what is wrong (and how many more problems there are)."""
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(part) for part in first.get("loc", ())) or "(document)"
    message = first.get("msg", "invalid")
    value = first.get("input")
    shown = ""
    if value is not None and not isinstance(value, (dict, list)):
        shown = f" (got {value!r})"
    more = f"; and {len(errors) - 1} more problem(s)" if len(errors) > 1 else ""
    return f"{source}: field '{field}': {message}{shown}{more}"
