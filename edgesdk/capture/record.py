"""One captured request as bytes: an ``.npz`` archive (no pickles) of the inputs under
``in/NAME``, the outputs under ``out/NAME`` and a JSON ``meta`` string (model, version,
release, variant, device, time). What the agent encrypts, and what decrypting gives back."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgesdk.capture.sealed import CaptureFileError

_INPUT, _OUTPUT, _META = "in/", "out/", "meta"


@dataclass
class CaptureRecord:
    """What one capture file holds."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


def _storable(array: Any) -> np.ndarray:
    """Object arrays (text tensors) as unicode, so that reading never needs a pickle."""
    array = np.asarray(array)
    return array.astype(str) if array.dtype == object else array


def pack_record(inputs: Mapping[str, Any], outputs: Mapping[str, Any], meta: Mapping[str, Any]) -> bytes:
    """The ``.npz`` bytes of one record (kept in memory: the plaintext never touches a disk)."""
    arrays = {f"{_INPUT}{k}": _storable(v) for k, v in inputs.items()}
    arrays.update({f"{_OUTPUT}{k}": _storable(v) for k, v in outputs.items()})
    arrays[_META] = np.asarray(json.dumps(dict(meta), sort_keys=True, default=str))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def unpack_record(data: bytes, *, source: str) -> CaptureRecord:
    """The record in ``data``; CaptureFileError if it is not one."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        meta = json.loads(str(arrays.pop(_META)))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CaptureFileError(f"{source}: decrypted, but not a capture record ({exc})") from exc
    inputs = {k[len(_INPUT) :]: v for k, v in arrays.items() if k.startswith(_INPUT)}
    outputs = {k[len(_OUTPUT) :]: v for k, v in arrays.items() if k.startswith(_OUTPUT)}
    return CaptureRecord(inputs, outputs, meta)
