"""Inline SVG charts for the dashboard: no script, no CDN, readable without JavaScript.

``line_chart`` draws numeric series over time (latency percentiles, temperature) with the
axis range (in its unit) and the last value labelled; ``state_band`` draws a categorical value over time
(precision, power source) as coloured spans with their names.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
_BAND = ("#dbeafe", "#fee2e2", "#dcfce7", "#f3e8ff", "#ffedd5", "#cffafe")


def _clock(ts: float) -> str:
    return time.strftime("%H:%M", time.localtime(ts))


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    unit: str,
    title: str,
    width: int = 640,
    height: int = 170,
    threshold: float | None = None,
) -> str:
    """One SVG with a polyline per series (points are (unix time, value)); ``threshold``: a
    dashed line at that value (an alert's level), kept inside the value axis."""
    points = [p for values in series.values() for p in values]
    label = html.escape(f"{title} ({unit})")  # the unit on the chart itself, not only in its legend
    if not points:
        return f'<figure class="chart"><figcaption>{label}</figcaption><p class="empty">no data yet</p></figure>'
    left, right, top, bottom = 64, 8, 8, 22  # room for "123 ms" left of the plot
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    v0, v1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    v1 = max(v1, threshold) if threshold is not None else v1
    t1 = t1 if t1 > t0 else t0 + 1
    v1 = v1 if v1 > v0 else v0 + 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def xy(ts: float, value: float) -> str:
        x = left + (ts - t0) / (t1 - t0) * plot_w
        y = top + plot_h - (value - v0) / (v1 - v0) * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{label}">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ddd"/>',
        f'<text x="{left - 4}" y="{top + 10}" text-anchor="end" class="axis">{v1:.3g} {html.escape(unit)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">{v0:.3g} {html.escape(unit)}</text>',
        f'<text x="{left}" y="{height - 6}" class="axis">{_clock(t0)}</text>',
        f'<text x="{width - right}" y="{height - 6}" text-anchor="end" class="axis">{_clock(t1)}</text>',
    ]
    if threshold is not None:
        y = xy(t0, threshold).split(",")[1]
        parts.append(
            f'<line class="threshold" x1="{left}" x2="{width - right}" y1="{y}" y2="{y}" '
            'stroke="#dc2626" stroke-dasharray="4 3"/>'
        )
    legend = []
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        if values:
            coords = " ".join(xy(ts, v) for ts, v in values)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
            last = values[-1][1]
            legend.append(f'<span style="color:{colour}">■</span> {html.escape(name)} {last:.3g} {html.escape(unit)}')
    parts.append("</svg>")
    return (
        f'<figure class="chart"><figcaption>{label} <small>{" · ".join(legend)}</small></figcaption>'
        + "".join(parts)
        + "</figure>"
    )


def state_band(points: Sequence[tuple[float, str | None]], *, title: str, width: int = 640, height: int = 46) -> str:
    """Spans of a categorical value over time (each point holds until the next)."""
    label = html.escape(title)
    known = [(ts, value) for ts, value in points if value]
    if not known:
        return f'<figure class="chart"><figcaption>{label}</figcaption><p class="empty">no data yet</p></figure>'
    t0, t1 = known[0][0], max(known[-1][0], known[0][0] + 1)
    names: list[str] = []
    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{label}">']
    spans: list[tuple[float, float, str]] = []
    for index, (ts, value) in enumerate(known):
        end = known[index + 1][0] if index + 1 < len(known) else t1
        if spans and spans[-1][2] == value:
            spans[-1] = (spans[-1][0], end, value)
        else:
            spans.append((ts, end, str(value)))
    for start, end, value in spans:
        if value not in names:
            names.append(value)
        colour = _BAND[names.index(value) % len(_BAND)]
        x = (start - t0) / (t1 - t0) * width
        w = max(1.0, (end - start) / (t1 - t0) * width)
        parts.append(f'<rect x="{x:.1f}" y="4" width="{w:.1f}" height="24" fill="{colour}" stroke="#999"/>')
        parts.append(f'<text x="{x + 4:.1f}" y="20" class="band">{html.escape(value)}</text>')
    parts.append(f'<text x="0" y="{height - 4}" class="axis">{_clock(t0)}</text>')
    parts.append(f'<text x="{width}" y="{height - 4}" text-anchor="end" class="axis">{_clock(t1)}</text></svg>')
    return f'<figure class="chart"><figcaption>{label}</figcaption>' + "".join(parts) + "</figure>"
