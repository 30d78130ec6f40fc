"""The per-output metrics, kept importable under their converters name.

The machinery lives in the shared core (edgesdk/quality/output_metrics.py) so that the device
agent, which never imports the converters, judges outputs the same way.
"""

from edgesdk.quality.output_metrics import (
    AGREEMENT_KINDS,
    DEFAULT_ABS_SHARE,
    DEFAULT_THRESHOLDS,
    ERROR_KINDS,
    KINDS,
    Kind,
    OutputMetric,
    choose,
    greedy_ctc,
    mask_iou,
    parse_metric,
    per_sample,
    read_output,
    requested_metrics,
    resolve,
    sentence,
)

__all__ = [
    "AGREEMENT_KINDS",
    "DEFAULT_ABS_SHARE",
    "DEFAULT_THRESHOLDS",
    "ERROR_KINDS",
    "KINDS",
    "Kind",
    "OutputMetric",
    "choose",
    "greedy_ctc",
    "mask_iou",
    "parse_metric",
    "per_sample",
    "read_output",
    "requested_metrics",
    "resolve",
    "sentence",
]
