"""The dashboard's line charts say their unit (issue 40: "the latency chart has no unit"): in
the caption and on both ends of the value axis, not only beside the legend's last values."""

from __future__ import annotations

import re

from edgesdk.fleet.service.charts import line_chart


def test_line_chart_names_its_unit_in_the_caption_and_on_the_value_axis() -> None:
    svg = line_chart({"p95": [(1000.0, 2.5), (1060.0, 4.0)]}, unit="ms", title="latency")
    assert "<figcaption>latency (ms)" in svg
    axis = re.findall(r'text-anchor="end" class="axis">([^<]+)</text>', svg)
    assert axis[:2] == ["4 ms", "0 ms"], axis
    empty = line_chart({"p95": []}, unit="ms", title="latency")
    assert "latency (ms)" in empty and "no data yet" in empty
