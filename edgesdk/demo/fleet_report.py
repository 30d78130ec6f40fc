"""The demo's fleet report: one self-contained HTML page with plots (PNG, base64-embedded).

Plots, per device over the demo's time: the agent's own p95 inference latency (from its
``/metrics``), the hottest sensor, the precision serving (from ``/v1/status``), and a rollout
timeline (which release each device served, with the deployments' events on top).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesdk.demo.collector import Sample
    from edgesdk.demo.story import DemoResult

PRECISION_LEVELS = ["int8", "fp16", "fp32"]
RELEASE_COLOURS = {1: "#9ecae1", 2: "#31a354", 3: "#de2d26"}


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def binned_p95(times: list[float], latencies_ms: list[float], bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Per ``bin_s`` window: (window centre, p95 of the latencies that ended in it)."""
    import numpy as np

    if not times:
        return [], []
    t = np.asarray(times)
    v = np.asarray(latencies_ms)
    bins = np.floor(t / bin_s).astype(int)
    centres, values = [], []
    for b in np.unique(bins):
        centres.append((b + 0.5) * bin_s)
        values.append(float(np.percentile(v[bins == b], 95)))
    return centres, values


def render_plots(
    samples: dict[str, list[Sample]],
    timeline: list[dict[str, Any]],
    client_latency: dict[str, tuple[list[float], list[float]]] | None = None,
) -> list[tuple[str, str]]:
    """(title, base64 PNG) for each plot. ``client_latency``: device → (seconds, ms) per request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = sorted(samples)
    return [
        ("Latency, temperature and precision", _device_series_plot(plt, samples, devices, timeline, client_latency)),
        ("Rollout timeline", _rollout_timeline_plot(plt, samples, devices, timeline)),
    ]


def _device_series_plot(
    plt: Any,
    samples: dict[str, list[Sample]],
    devices: list[str],
    timeline: list[dict[str, Any]],
    client_latency: dict[str, tuple[list[float], list[float]]] | None,
) -> str:
    """Three stacked plots over time, a line per device: p95 latency, hottest sensor and the
    precision serving; the deployments marked on each. Base64 PNG."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    latency_ax, temp_ax, precision_ax = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, device in enumerate(devices):
        colour = colours[index % len(colours)]
        series = samples[device]
        t = [s.t for s in series]
        if client_latency and device in client_latency:
            centres, p95 = binned_p95(*client_latency[device])
            latency_ax.plot(centres, p95, color=colour, label=f"{device} client (1-s p95)")
        latency_ax.plot(
            t,
            [s.p95_ms if s.p95_ms is not None else float("nan") for s in series],
            color=colour,
            linestyle=":",
            linewidth=1.0,
            label=f"{device} agent /metrics p95",
        )
        temp_ax.plot(
            t, [s.temperature_c if s.temperature_c is not None else float("nan") for s in series], label=device
        )
        levels = [
            PRECISION_LEVELS.index(s.precision) if s.precision in PRECISION_LEVELS else float("nan") for s in series
        ]
        precision_ax.step(t, levels, where="post", color=colour)
    latency_ax.set_ylabel("p95 latency (ms)")
    latency_ax.set_yscale("log")
    temp_ax.set_ylabel("hottest sensor (°C)")
    precision_ax.set_ylabel("precision serving")
    precision_ax.set_yticks(range(len(PRECISION_LEVELS)), PRECISION_LEVELS)
    precision_ax.set_ylim(-0.4, len(PRECISION_LEVELS) - 0.6)
    precision_ax.set_xlabel("seconds since the demo started")
    for ax in axes:
        ax.grid(alpha=0.3)
        _mark_deployments(ax, timeline)
    latency_ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), fontsize="x-small", ncol=len(devices))
    png = _png(fig)
    plt.close(fig)
    return png


def _rollout_timeline_plot(
    plt: Any, samples: dict[str, list[Sample]], devices: list[str], timeline: list[dict[str, Any]]
) -> str:
    """A bar per device coloured by the release it served, the pushes and aborts on top. Base64 PNG."""
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(devices) + 1.8))
    for row, device in enumerate(devices):
        series = samples[device]
        for current, following in zip(series, series[1:]):
            if current.release is None:
                continue
            ax.barh(
                row,
                following.t - current.t,
                left=current.t,
                color=RELEASE_COLOURS.get(current.release, "#888888"),
                edgecolor="none",
            )
    ax.set_yticks(range(len(devices)), devices)
    ax.invert_yaxis()
    _mark_deployments(ax, timeline, label=True)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=colour)
        for colour in RELEASE_COLOURS.values()  # type: ignore[attr-defined]
    ]
    ax.legend(
        handles,
        [f"release {r}" for r in RELEASE_COLOURS],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=3,
        fontsize="small",
    )
    ax.set_xlabel("seconds since the demo started")
    ax.set_title("Rollout timeline: release served per device")
    ax.grid(axis="x", alpha=0.3)
    png = _png(fig)
    plt.close(fig)
    return png


def _mark_deployments(ax: Any, timeline: list[dict[str, Any]], *, label: bool = False) -> None:
    for event in timeline:
        if event["event"] == "created":
            ax.axvline(event["t"], color="#555555", linestyle="--", linewidth=0.8)
            if label:
                ax.annotate(
                    f"push {event['bundle']}",
                    (event["t"], 0),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, 3),
                    textcoords="offset points",
                    fontsize="small",
                )
        elif event["event"] == "aborted":
            ax.axvline(event["t"], color="#de2d26", linestyle=":", linewidth=1.2)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def write_fleet_report(
    path: Path,
    result: DemoResult,
    samples: dict[str, list[Sample]],
    client_latency: dict[str, tuple[list[float], list[float]]] | None = None,
) -> Path:
    """Write the fleet report for ``result`` to ``path``."""
    plots = render_plots(samples, result.timeline, client_latency)
    devices = _devices_table(result)
    rollouts, per_device = _rollout_tables(result)
    steps = _table(["step", "seconds", "detail"], [[s["step"], s["seconds"], s["detail"]] for s in result.steps])
    images = "".join(
        f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
        for title, data in plots
    )
    heat_line = _heat_line(result.heat)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgesdk demo: fleet report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>edgesdk demo: fleet report</h1>
<p>Profile <b>{html.escape(result.profile)}</b>, {len(result.devices)} agents, {result.wall_s:.0f} s in all.
{html.escape(heat_line)}</p>
<h2>Devices at the end</h2>{devices}
<h2>Rollouts</h2>{rollouts}{per_device}
{images}
<h2>Steps</h2>{steps}
</body></html>
"""
    path.write_text(page)
    return path


def _devices_table(result: DemoResult) -> str:
    """Each device at the end: what it serves, the precisions it used, its requests and latency."""
    return _table(
        [
            "device",
            "serving",
            "variant",
            "precisions used",
            "requests",
            "failed",
            "accuracy",
            "client p50 ms",
            "client p95 ms",
        ],
        [
            [
                d["device_id"],
                f"{d['version']} (release {d['release']})",
                d["variant"],
                d["precisions_used"],
                d["requests"],
                d["failed_requests"],
                f"{d['accuracy']:.1%}" if d["accuracy"] is not None else None,
                d["client_p50_ms"],
                d["client_p95_ms"],
            ]
            for d in result.devices
        ],
    )


def _rollout_tables(result: DemoResult) -> tuple[str, str]:
    """The rollouts (waves, result, time), then every device's part in each."""
    rollouts = _table(
        ["rollout", "version", "waves", "result", "reason", "seconds"],
        [
            [
                r["name"],
                r["version"],
                " | ".join(", ".join(w) for w in r["waves"]),
                r["state"],
                r["reason"],
                r["seconds"],
            ]
            for r in result.rollouts
        ],
    )
    per_device = _table(
        ["rollout", "device", "wave", "state", "release", "reason"],
        [
            [r["name"], d["device_id"], d["wave"], d["state"], d["release"], d["reason"]]
            for r in result.rollouts
            for d in r["devices"]
        ],
    )
    return rollouts, per_device


def _heat_line(heat: dict[str, Any]) -> str:
    """One sentence: when the heated device stepped down its precision and came back."""
    if heat.get("back_up_at_s") is None:
        return "The heat wave was not observed."
    return (
        f"{heat['device']} stepped down at {heat['stepped_down_at_s']:.0f} s (as low as {heat['lowest_precision']}) "
        f"and was back on {heat['top']} at {heat['back_up_at_s']:.0f} s."
    )
