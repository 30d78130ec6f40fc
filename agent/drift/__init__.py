"""Drift and data-quality figures of the device's own traffic (issue 41): a tap on every model's
answers counts live values into the bins of the reference profile signed into its bundle, and
each telemetry report carries the drift scores and counts (``ModelQuality``)."""
