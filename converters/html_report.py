"""report.html: the ConversionReport for people, with plots embedded as base64 PNGs."""

from __future__ import annotations

import base64
import html
import io

from edgesdk.schemas.manifest import AccuracyResult
from edgesdk.schemas.report import ConversionReport, TaskFigure

_COLORS = {"onnx": "tab:blue", "tflite": "tab:orange", "openvino": "tab:purple", "coreml": "tab:gray"}
_MARKERS = {"fp32": "o", "fp16": "s", "bf16": "P", "int8": "^", "int4": "v"}


def _plots(report: ConversionReport) -> list[str]:
    """Accuracy vs size and latency vs size: colour = format, marker = precision."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    numeric = [v for v in report.variants if v.accuracy is not None]
    if not numeric:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in numeric:
        kib = v.size / 1024
        style = {
            "color": _COLORS.get(v.format.value, "black"),
            "marker": _MARKERS.get(v.precision.value, "o"),
            "s": 70,
            "alpha": 0.85,
        }
        axes[0].scatter(kib, v.accuracy.value, label=v.id, **style)  # type: ignore[union-attr]
        if v.measurements.latency_p50_ms:
            axes[1].scatter(kib, v.measurements.latency_p50_ms, **style)
            axes[1].annotate(
                v.id, (kib, v.measurements.latency_p50_ms), fontsize=7, xytext=(5, 3), textcoords="offset points"
            )
    axes[0].axhline(report.gate, color="red", linestyle="--", linewidth=1, label=f"gate {report.gate:g}")
    axes[0].set(xlabel="artifact size (KiB)", ylabel=f"{report.metric} vs reference", title="accuracy vs size")
    axes[1].set(
        xlabel="artifact size (KiB)", ylabel="median latency, batch 1 (ms, log)", title="latency vs size (this host)"
    )
    axes[1].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout()
    image = _png(fig)
    plt.close(fig)
    return [image]


def _png(fig: object) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)  # type: ignore[attr-defined]
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _row(cells: list[object]) -> str:
    return "<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in cells) + "</tr>"


def _bound(acc: AccuracyResult | None) -> str:
    if acc is None or acc.lower_bound is None:
        return ""
    return f"{acc.lower_bound:.4f} ({acc.verdict})"


def _task_bar(f: TaskFigure) -> str:
    """A small inline SVG of one end-to-end figure: the gate's line (red), the mean (grey) and
    what the gate reads (black: the worst file, a percentile or a share) on a 0..1 scale (0..2x the
    gate for an error rate)."""
    top = 1.0 if f.higher_is_better else max(2 * f.gate, f.value, f.mean, 1e-9)

    def x(v: float) -> float:
        return 4 + 152 * min(max(v / top, 0.0), 1.0)

    return (
        f'<svg width="160" height="14" role="img" aria-label="{html.escape(f.name)}">'
        f'<rect x="4" y="5" width="152" height="4" fill="#eee"/>'
        f'<line x1="{x(f.gate):.1f}" x2="{x(f.gate):.1f}" y1="0" y2="14" stroke="red"/>'
        f'<circle cx="{x(f.mean):.1f}" cy="7" r="3" fill="#999"/><circle cx="{x(f.value):.1f}" cy="7" r="3"/></svg>'
    )


def _task_rows(report: ConversionReport) -> str:
    """Each variant's end-to-end figures (task results vs yours), beside its tensor metrics."""
    rows = [
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (v.id, f.name, f"{f.value:.4f}", f.statistic,
        f"{f.mean:.4f}", f"{'≥' if f.higher_is_better else '≤'} {f.gate:g}", "pass" if f.passed else "fail",
        f.worst or "")) + f"<td>{_task_bar(f)}</td></tr>"
        for v in report.variants if v.task_accuracy is not None
        for f in v.task_accuracy.figures
    ]  # fmt: skip
    if not rows:
        return ""
    return (
        "<h2>End to end: task results against yours</h2><p>Each figure per file; the gate reads the black dot "
        "(the worst file, a named percentile, or a share), the grey dot is the mean, the red line the gate.</p>"
        "<table><tr><th>variant</th><th>figure</th><th>value</th><th>statistic</th><th>mean</th><th>gate</th>"
        f"<th>verdict</th><th>worst file</th><th></th></tr>{''.join(rows)}</table>"
    )


def render_html(report: ConversionReport) -> str:
    """A self-contained HTML page: plots, shipped variants, rejections and the planner's reasoning."""
    shipped = _shipped_rows(report)
    per_output = _output_rows(report)
    rejected = [_row([r.format.value, r.precision.value, r.reason]) for r in report.rejected]
    recipes = _recipe_rows(report)
    arch = _timing_note(report)
    decisions = "".join(f"<li>{html.escape(d)}</li>" for d in report.decisions)
    plots = "".join(
        f'<img alt="accuracy, size and latency per variant" src="data:image/png;base64,{p}">' for p in _plots(report)
    )
    if not plots:
        plots = "<p>(matplotlib is not installed: no plots)</p>"
    title = html.escape(f"{report.model_name} for {report.profile}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgesdk convert: {title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}th{{background:#f3f3f3}}img{{max-width:100%}}</style></head>
<body><h1>{title}</h1>
<p>source <code>{html.escape(report.source)}</code>, created {report.created.isoformat()}, metric <b>{report.metric}</b>, gate <b>{report.gate:g}</b></p>
{plots}
<h2>Shipped variants</h2>
<table><tr><th>variant</th><th>runtime</th><th>method</th><th>size</th><th>{report.metric}</th><th>95% lower bound</th><th>ladder</th><th>max abs diff</th>
<th>load ms</th><th>p50 ms</th><th>p95 ms</th><th>peak RSS MB</th><th>convert s</th><th>notes</th></tr>{"".join(shipped)}</table>
<h2>Every output against its own metric</h2>
<p>The gate reads the tail of a per-sample figure (the worst sample, or the 5th percentile from 20 samples on;
95th for an error), or an agreement on its Wilson bound; the mean is shown beside it.</p>
<table><tr><th>variant</th><th>output</th><th>metric</th><th>value</th><th>statistic</th><th>95% bound</th><th>mean</th>
<th>gate</th><th>verdict</th><th>why this metric</th></tr>{"".join(per_output) or "<tr><td colspan=10>none</td></tr>"}</table>
{_task_rows(report)}
{arch}
<h2>Every recipe tried (family: {html.escape(report.family or "?")})</h2>
<table><tr><th>variant</th><th>method</th><th>layers in float</th><th>{report.metric}</th><th>95% lower bound</th>
<th>size</th><th>p50 ms</th><th>outcome</th><th>reason</th></tr>{"".join(recipes) or "<tr><td colspan=9>none</td></tr>"}</table>
<h2>Rejected</h2><table><tr><th>format</th><th>precision</th><th>reason</th></tr>{"".join(rejected) or "<tr><td colspan=3>none</td></tr>"}</table>
<h2>Planner decisions</h2><ol>{decisions}</ol>
</body></html>
"""


def _shipped_rows(report: ConversionReport) -> list[str]:
    """A row per shipped variant: accuracy, its bound, ladder role, differences and measurements."""
    shipped = []
    for v in report.variants:
        acc = v.accuracy
        shipped.append(
            _row(
                [
                    v.id,
                    v.runtime.value,
                    v.quantization_method or "",
                    f"{v.size / 1024:.1f} KiB",
                    f"{acc.value:.4f}" if acc else "unvalidated",
                    _bound(acc),
                    v.ladder_role,
                    ", ".join(f"{k}: {d:.3g}" for k, d in acc.max_abs_diff.items()) if acc else "",
                    v.measurements.load_ms,
                    v.measurements.latency_p50_ms,
                    v.measurements.latency_p95_ms,
                    v.measurements.peak_rss_mb,
                    v.measurements.convert_s,
                    v.measurements.note,
                ]
            )
        )
    return shipped


def _output_rows(report: ConversionReport) -> list[str]:
    """A row per variant and output: its own metric, the figure the gate reads, the mean, the verdict."""
    return [
        _row([v.id, o.output, o.metric, f"{o.value:.6g}", o.statistic, "" if o.bound is None else f"{o.bound:.6g}",
              f"{o.mean:.6g}", f"{'≤' if o.metric in ('abs', 'max_abs') else '≥'} {o.threshold:.4g}", o.verdict, o.why])
        for v in report.variants
        for o in v.output_accuracy
    ]  # fmt: skip


def _recipe_rows(report: ConversionReport) -> list[str]:
    """A row per recipe tried, kept or dropped, and why."""
    return [
        _row(
            [
                f"{t.format.value}-{t.precision.value}",
                t.method or "",
                t.kept_float or "",
                "" if t.accuracy is None else f"{t.accuracy:.4f}",
                "" if t.lower_bound is None else f"{t.lower_bound:.4f} ({t.verdict})",
                "" if t.size is None else f"{t.size / 1024:.1f} KiB",
                t.latency_p50_ms,
                t.outcome,
                t.reason,
            ]
        )  # fmt: skip
        for t in report.recipes
    ]


def _timing_note(report: ConversionReport) -> str:
    """Where the latencies were measured, and a warning when the device's architecture differs."""
    if not (report.host_arch and report.device_arch):
        return ""
    same = report.host_arch == report.device_arch
    return (
        f"<p>Latencies are <b>host timings</b> ({html.escape(report.host_arch)})"
        + ("." if same else f"; the device is {html.escape(report.device_arch)}: the latency ordering is "
           "<b>unverified until measured on the device</b>.")
        + "</p>"
    )  # fmt: skip
