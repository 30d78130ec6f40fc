"""The per-output metric machinery is shared core: the device agent judges outputs with it
without importing the converters, and the converters' names are the very same objects."""

from __future__ import annotations

import subprocess
import sys

BLOCK_CONVERTERS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "edgesdk.converters" or name.startswith("edgesdk.converters."):
            raise ImportError("the device must not import " + name)
sys.meta_path.insert(0, Block())
from edgesdk.quality.output_metrics import choose, per_sample, read_output
import numpy as np
ref = np.random.default_rng(0).normal(size=(4, 21, 3)).astype("float32")
metric = choose("landmarks", ref, alone=False)
print(metric.kind, read_output(type(metric)(metric.kind, 0.5), per_sample(metric, ref, ref)).verdict)
"""


def test_output_metrics_import_on_the_device_without_the_converters() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCK_CONVERTERS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["abs", "pass"]


def test_the_converters_metric_names_are_the_shared_ones() -> None:
    from edgesdk.converters import output_metrics, statistics

    from edgesdk.quality import output_metrics as shared
    from edgesdk.quality import tail_statistics

    assert output_metrics.resolve is shared.resolve and output_metrics.OutputMetric is shared.OutputMetric
    assert statistics.tail_reading is tail_statistics.tail_reading
    assert statistics.wilson_lower is tail_statistics.wilson_lower
