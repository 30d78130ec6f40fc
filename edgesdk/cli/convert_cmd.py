"""``edgesdk convert``: a model → validated device artifacts + report, for one device profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np

from edgesdk.cli.output import ProgressLines, json_option, print_json, print_table, profiles_dirs
from edgesdk.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgesdk.schemas.data_spec import DataSpec
    from edgesdk.schemas.report import ConversionReport

_DTYPES = ("float32", "float16", "int64", "int32", "uint8", "int8", "bool")


def _parse_input(spec: str) -> tuple[str, np.ndarray]:
    """``name=1x3x224x224[:dtype]`` → a zero example of that shape."""
    name, _, rest = spec.partition("=")
    shape_text, _, dtype = rest.partition(":")
    dtype = dtype or "float32"
    try:
        shape = tuple(int(d) for d in shape_text.replace(",", "x").split("x") if d)
    except ValueError as exc:
        raise UsageError(f"--input {spec!r}: expected NAME=1x3x224x224[:dtype]") from exc
    if not name or not shape or dtype not in _DTYPES:
        raise UsageError(f"--input {spec!r}: expected NAME=1x3x224x224[:dtype] with dtype one of {', '.join(_DTYPES)}")
    return name, np.zeros(shape, dtype=dtype)


def _read_data_spec(path: Path | None) -> DataSpec:
    """The --data-spec file (YAML or JSON), or an empty spec; one clear line when it is wrong."""
    from edgesdk.schemas.data_spec import DataSpec

    if path is None:
        return DataSpec()
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--data-spec {path}: cannot read it ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"--data-spec {path}: not YAML or JSON ({type(exc).__name__})") from exc
    return DataSpec.parse_obj_clear(raw or {}, source=f"--data-spec {path}")


def _task_check(
    pipeline: Path | None,
    files: tuple[Path | None, Path | None, Path | None],
    images: Path | None,
    reference: str | None,
    gates: tuple[str, ...],
) -> object:
    """The end-to-end gate's inputs, read before any conversion (None when not asked for);
    ``files``: the pipeline's labels, tokenizer.json and vocabulary, where given."""
    given = {"--pipeline": pipeline, "--validation-images": images, "--reference": reference}
    if not any(given.values()):
        if any(files):
            raise UsageError("--labels, --tokenizer and --vocabulary belong to --pipeline; give --pipeline too")
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise UsageError(
            f"the end-to-end gate needs --pipeline, --validation-images and --reference; missing {', '.join(missing)}"
        )
    from edgesdk.converters.end_to_end import prepare_task_check
    from edgesdk.schemas.pipeline import load_pipeline

    assert pipeline is not None and images is not None and reference is not None
    return prepare_task_check(load_pipeline(pipeline, *files), images, reference, gates)


def _task_cell(task: object) -> str:
    """A variant's end-to-end figure for the table (not run: it could not run on this host)."""
    from edgesdk.schemas.report import TaskAccuracy

    if not isinstance(task, TaskAccuracy):
        return "not run here"
    if task.metric != "top1_label":  # boxes, mask, text, embedding: each gate's figure (its tail)
        return ", ".join(f"{f.name} {f.value:.4f}" for f in task.figures) + f" ({task.verdict})"
    return f"{task.agreement:.4f} (≥{task.lower_bound:.4f}: {task.verdict})"


@click.command("convert")
@click.argument("model")
@click.option("--profile", "profile_name", required=True, help="Device profile name (see `edgesdk profiles list`).")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    help="Output directory (must not exist or be empty).",
)
@click.option("--calibration", type=click.Path(path_type=Path), help=".npz of calibration inputs, keyed by input name.")
@click.option("--validation", type=click.Path(path_type=Path), help=".npz of validation inputs (and optional labels).")
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="[OUTPUT=]KIND[:THRESHOLD]",
    help="How an output is judged (repeatable; default: chosen per output): top1, cosine, abs (THRESHOLD: "
    "tolerance in the output's units), iou, ctc (add :blank=N), max_abs; e.g. --metric landmarks=abs:1.5. "
    "Without OUTPUT= it applies to every output not named.",
)
@click.option("--gate", type=float, help="Minimum of every metric but abs (default: 0.99; iou 0.9).")
@click.option("--formats", help="Comma-separated subset of the profile's formats (onnx,tflite,openvino,coreml).")
@click.option("--precisions", help="Comma-separated subset of precisions (fp32,fp16,int8).")
@click.option("--name", help="Model name in the report (default: from the file or factory).")
@click.option("--output-names", help="Comma-separated output names for a PyTorch model (default: output).")
@click.option(
    "--input", "inputs", multiple=True, help="Example input NAME=1x3x224x224[:dtype] when no data file names it."
)
@click.option(
    "--dynamic-axis",
    "dynamic_axes",
    multiple=True,
    help="Extra dynamic axis of a PyTorch model's tensor, NAME:AXIS:LABEL (e.g. input_ids:1:sequence); axis 0 is always the batch.",
)
@click.option(
    "--int8-method",
    "int8_methods",
    multiple=True,
    help="Only these int8 recipes (repeatable), e.g. static-qdq-percentile, nncf-qdq, dynamic-int8-per-channel, "
    "weight-only-int8, nncf-ptq-transformer, nncf-weights-int8, static-int8-full-integer, linear-weights-int8. "
    "Default: the recipes of the model's family (transformer/convnet, docs/converters.md); the fastest that "
    "holds the gate wins.",
)
@click.option(
    "--batch-axis",
    "batch_axes",
    multiple=True,
    help="Which axis of a tensor holds the samples when the model's dimension names do not say, NAME=AXIS "
    "(e.g. state=1), or NAME=none for an array fed as it is with every sample. Arrays keep the model's layout.",
)
@click.option(
    "--data-spec",
    "data_spec",
    type=click.Path(path_type=Path),
    help="A YAML/JSON file with batch_axes and state (the --batch-axis and --state of the data), schema data-spec; flags win.",
)
@click.option(
    "--state",
    "state_pairs",
    multiple=True,
    help="A stateful model's state input and the output that carries it to the next step, INPUT=OUTPUT "
    "(found by name when they match, e.g. state=stateN); inputs with a leading step axis then run as streams.",
)
@click.option(
    "--as-is",
    "as_is",
    is_flag=True,
    help="Ship MODEL (.onnx, .tflite or OpenVINO .xml) as it is: one variant at the precision found in it, "
    "validated in its runtime, then packaged like any other.",
)
@click.option(
    "--pipeline",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The pipeline file (YAML) you will package: with --validation-images and --reference, every variant "
    "is also gated end to end (decode, pre, model, post) against your own results.",
)
@click.option("--labels", type=click.Path(dir_okay=False, path_type=Path), help="The labels file of --pipeline.")
@click.option(
    "--tokenizer", type=click.Path(dir_okay=False, path_type=Path), help="A text --pipeline's tokenizer.json."
)
@click.option(
    "--vocabulary", type=click.Path(dir_okay=False, path_type=Path), help="A ctc --pipeline's tokens, one a line."
)
@click.option(
    "--validation-images",
    type=click.Path(path_type=Path),
    help="A folder of raw files for the end-to-end gate: .jpg/.png (image), .wav (audio) or .txt (text).",
)
@click.option(
    "--reference",
    help="Your current pipeline: MODULE:FUNCTION or FILE.py:FUNCTION (called with each file's path, or its bytes "
    "if its first parameter is annotated bytes; returns the label, or labels and scores), or a FILE.json of labels "
    "by file name. It is your code, imported and run on this host.",
)
@click.option(
    "--task-gate",
    "task_gates",
    multiple=True,
    metavar="[NAME=]VALUE[@pN]",
    help="An end-to-end gate (repeatable): top1 (classes, default 0.99; a plain VALUE), recall, precision, "
    "box_iou, match_iou (boxes), mask_iou, exact, cer (text), cosine (embedding); e.g. --task-gate cer=0.05@p95.",
)
@json_option
@click.pass_context
def convert(
    ctx: click.Context,
    model: str,
    profile_name: str,
    out: Path,
    calibration: Path | None,
    validation: Path | None,
    metrics: tuple[str, ...],
    gate: float | None,
    formats: str | None,
    precisions: str | None,
    name: str | None,
    output_names: str | None,
    inputs: tuple[str, ...],
    dynamic_axes: tuple[str, ...],
    int8_methods: tuple[str, ...],
    batch_axes: tuple[str, ...],
    data_spec: Path | None,
    state_pairs: tuple[str, ...],
    as_is: bool,
    pipeline: Path | None,
    labels: Path | None,
    tokenizer: Path | None,
    vocabulary: Path | None,
    validation_images: Path | None,
    reference: str | None,
    task_gates: tuple[str, ...],
    as_json: bool,
) -> None:
    """Convert MODEL (.onnx, .tflite, OpenVINO IR .xml, or module:factory returning an nn.Module) for a device profile.

    \b
    Every variant is validated in the runtime the device uses; the ones that miss the
    accuracy gate are repaired or dropped, the report says why. OUT gets report.json,
    report.html, golden.npz and artifacts/<variant>/.
    """
    from edgesdk.converters.input_spec import parse_batch_axes
    from edgesdk.converters.stateful import parse_state_pairs
    from edgesdk.toolchain import convert as run_convert
    from edgesdk.toolchain import load_profile

    profile = load_profile(profile_name, profiles_dirs=profiles_dirs(ctx))  # fail fast, before any heavy import
    layout_spec = _read_data_spec(data_spec)
    declared_axes: dict[str, int | str] = {**layout_spec.batch_axes, **parse_batch_axes(batch_axes)}
    declared_state = {**layout_spec.state, **parse_state_pairs(state_pairs)}
    example = dict(_parse_input(s) for s in inputs) or None
    axes = _parse_dynamic_axes(dynamic_axes)
    end_to_end = _task_check(pipeline, (labels, tokenizer, vocabulary), validation_images, reference, task_gates)
    report = _showing_progress(
        as_json,
        lambda show: run_convert(
            model,
            profile,
            out=out,
            calibration=calibration,
            validation=validation,
            metric=list(metrics) or "auto",
            gate=gate,
            formats=formats,
            precisions=precisions,
            name=name,
            output_names=output_names,
            example=example,
            dynamic_axes=axes or None,
            int8_methods=int8_methods or None,
            batch_axes=declared_axes or None,
            as_is=as_is,
            state_pairs=declared_state or None,
            end_to_end=end_to_end,
            progress=show,
        ),
    )
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    _print_variant_table(report)
    _print_notes(report)
    click.echo(f"wrote {out}/report.json, report.html, golden.npz and {len(report.variants)} variant(s)")


def _parse_dynamic_axes(specs: tuple[str, ...]) -> dict[str, dict[int, str]]:
    """--dynamic-axis NAME:AXIS:LABEL values → tensor → {axis: label}."""
    axes: dict[str, dict[int, str]] = {}
    for spec in specs:
        tensor, _, rest = spec.partition(":")
        axis, _, label = rest.partition(":")
        if not tensor or not axis.isdigit() or not label:
            raise UsageError(f"--dynamic-axis {spec!r}: expected NAME:AXIS:LABEL, e.g. input_ids:1:sequence")
        axes.setdefault(tensor, {})[int(axis)] = label
    return axes


def _showing_progress(
    as_json: bool, run: Callable[[Callable[[str, int, int], None]], ConversionReport]
) -> ConversionReport:
    """Runs the conversion with its progress on stderr (stdout is for the result, table or
    --json): a live bar on a terminal; off one, a line per step (a bar there would stay blank
    until the end)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True, highlight=False)
    lines = ProgressLines() if not (as_json or err.is_terminal) else None
    with Progress(
        SpinnerColumn(),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=as_json or lines is not None,
    ) as progress:
        task = progress.add_task("converting", total=None)

        def show(message: str, done: int, total: int) -> None:
            if lines is not None:
                lines(f"[{done + 1}/{total}] {message}")
            else:
                progress.update(task, description=message, completed=done, total=total)

        report = run(show)
    if lines is not None:
        lines(f"done: {len(report.variants)} variant(s)")
    return report


def _print_variant_table(report: ConversionReport) -> None:
    """One row per shipped variant: runtime, method, size, accuracy, host latency, ladder role
    (and the end-to-end figure when the gate ran)."""
    rows = []
    for v in report.variants:
        acc = f"{v.accuracy.value:.4f}" if v.accuracy else "unvalidated"
        if v.accuracy and v.accuracy.lower_bound is not None:
            acc += f" (≥{v.accuracy.lower_bound:.4f}: {v.accuracy.verdict})"
        rows.append(
            [
                v.id,
                v.runtime.value,
                v.quantization_method or "",
                f"{v.size / 1024:.1f} KiB",
                acc,
                v.measurements.latency_p50_ms,
                v.ladder_role,
            ]
            + ([_task_cell(v.task_accuracy)] if report.end_to_end else [])
        )
    print_table(
        f"{report.model_name} → {report.profile} ({report.metric}, gate {report.gate:g})",
        ["variant", "runtime", "method", "size", f"{report.metric} (95% lower bound)", "p50 ms (host)", "ladder"]
        + (["end to end: your labels (95% lower bound)"] if report.end_to_end else []),
        rows,
    )


def _print_notes(report: ConversionReport) -> None:
    """The lines under the table: decisions a user must not miss, each output's figure, the
    end-to-end figures and the rejections."""
    for line in report.decisions:
        # What a user must not miss: how much data the gate needs, overlap warnings, untested speed.
        if line.startswith(("gate ", "WARNING", "latency ordering")):
            click.echo(line)
    for v in report.variants:
        for judged in v.output_accuracy:  # every output's own figure: the tail, with the mean beside it
            click.echo(f"{v.id} {judged.note}")
        if v.accuracy and v.accuracy.verdict == "inconclusive" and not v.output_accuracy:
            click.echo(f"{v.id}: {v.accuracy.note}")
    for v in report.variants:
        if v.task_accuracy is not None:  # the end-to-end gate, beside the tensor figures above
            click.echo(f"{v.id} end to end: {v.task_accuracy.note}")
    for r in report.rejected:
        click.echo(f"rejected {r.format.value} {r.precision.value}: {r.reason}")
