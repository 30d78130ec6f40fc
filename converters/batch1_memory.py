"""A variant's memory as a device holds it: load plus one inference at batch 1, in a fresh process.

The RAM budget is judged on this figure (pipeline ``_apply_budgets``), and the agent admits
installs by it (``load_rss_mb``). It must not depend on how much data the user gave: the
validation pass runs batches of up to 64 samples for accuracy, and its activations grow with the
batch (issue 38: an OCR detector at 947 MB with 24 samples, 49 MB at batch 1). Nor on what the
converting process ran before: memory freed by the reference pass or by earlier variants stays in
the allocator and is reused, hiding most of a load's growth. So a child process imports the
runtime, notes its RSS, then loads the variant's bytes and runs one sample; the growth is the
peak over that baseline, the same "after import" split as the profile's measured runtime figures.

Run as ``python -m edgesdk.converters.batch1_memory RUNTIME FILES_JSON OPTIONS_JSON FEEDS_NPZ``;
it prints one JSON line, ``{"peak_mb": ...}``.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

#: A batch-1 load and run of any variant the converters build finishes well within this.
TIMEOUT_S = 300


def batch1_peak_mb(
    runtime: str, files: Mapping[str, Path], options: Mapping[str, str], feeds: Mapping[str, np.ndarray]
) -> float:
    """Peak RSS growth (MB) of loading ``files`` in ``runtime`` and running ``feeds`` (one sample,
    in the model's layout, float: quantized in the child as validation does) in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="edgesdk-batch1-") as scratch:
        npz = Path(scratch) / "feeds.npz"
        np.savez(npz, **{k: np.asarray(v) for k, v in feeds.items()})
        command = [
            sys.executable, "-m", __name__, runtime,
            json.dumps({k: str(p) for k, p in files.items()}), json.dumps(dict(options)), str(npz),
        ]  # fmt: skip
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"{runtime}: a batch-1 load and run took over {TIMEOUT_S} s") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ConversionError(f"{runtime}: measuring memory at batch 1 in a fresh process failed: {last}")
    return float(json.loads(lines[-1])["peak_mb"])


def _measure(runtime: str, files: Mapping[str, str], options: Mapping[str, str], npz: str) -> float:
    from edgesdk.converters.validate import _PeakRss, _quantize

    from edgesdk.runtimes import load_variant
    from edgesdk.runtimes.registry import RUNTIME_BACKENDS, get_backend
    from edgesdk.schemas.common import RuntimeName

    blobs = {name: Path(path).read_bytes() for name, path in files.items()}
    with np.load(npz) as archive:
        feeds = {k: archive[k] for k in archive.files}
    # The runtime is imported before the baseline: what its import costs is the profile's figure.
    get_backend(runtime)
    importlib.import_module(RUNTIME_BACKENDS[RuntimeName(runtime)][1])
    with _PeakRss() as rss:
        model = load_variant(runtime, blobs, options=options)
        specs = {s.name: s for s in model.inputs}
        model.run({k: _quantize(v, specs[k]) for k, v in feeds.items()})
    model.close()
    return rss.growth_mb


if __name__ == "__main__":
    peak = _measure(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4])
    print(json.dumps({"peak_mb": round(peak, 2)}))
