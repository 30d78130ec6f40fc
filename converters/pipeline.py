"""``convert()``: plan → build → validate in the device's runtime → gates, repair → budgets → report.

Everything is built in a scratch directory and the output directory appears only at the end,
by one rename, so a failed or interrupted conversion leaves nothing half-written in ``out``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.as_is import AS_IS, as_is_converter, as_is_plan, refuse_quantized_source
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.data import LABEL_KEY, load_npz, subset
from edgesdk.converters.input_spec import first_sample
from edgesdk.converters.model_data import arrange_data as _arrange_data
from edgesdk.converters.model_data import golden_set
from edgesdk.converters.planner import Plan, PlannedVariant, make_plan, repairable
from edgesdk.converters.quiet import quiet_native
from edgesdk.converters.recipes import Family, detect_family
from edgesdk.converters.registry import CONVERTERS, get_converter
from edgesdk.converters.runtime_footprint import runtime_footprints
from edgesdk.converters.source import calibration_states, load_source, reference_outputs
from edgesdk.converters.speed_gate import assign_roles, device_arch, host_arch
from edgesdk.converters.statistics import check_disjoint, minimum_samples_sentence
from edgesdk.converters.toolchain_errors import one_line
from edgesdk.converters.validate import DEFAULT_GATES, Metric, ValidationResult, choose_metric, validate_numeric

from edgesdk.drift.profile import write_profile
from edgesdk.errors import AccuracyGateError, BudgetError, ConversionError, EdgeSDKError, UnsupportedOpError, UsageError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.quality.output_metrics import OutputMetric, requested_metrics, resolve
from edgesdk.schemas.common import ModelFormat, Precision
from edgesdk.schemas.manifest import LadderRole
from edgesdk.schemas.profile import DeviceProfile
from edgesdk.schemas.report import ConversionReport, RecipeTrial, RejectedVariant, ShippedVariant

#: ``progress(message, done, total)``: called as each step starts, with ``total`` the number of
#: :class:`Stage` (the same on every call) and ``done`` the stages finished before this step.
Progress = Callable[[str, int, int], None]


class Stage(IntEnum):
    """The stages of every conversion, in order: what ``done`` and ``total`` of a progress call count.

    Not the builds: how many there are is only known once the model is read and planned, and
    repair adds rounds as gates are missed, so a count of builds would change under a progress
    bar. The message of a build says which one it is ("onnx-int8 (...): converting, 3 of 7")."""

    READ = 0
    REFERENCE = 1
    BUILD = 2
    TIMING = 3
    REPORT = 4


class _Steps:
    """Reports each step to a :data:`Progress` callback, counting stages (see :class:`Stage`)."""

    def __init__(self, sink: Progress | None) -> None:
        self._sink = sink
        self._done = 0
        self.builds_planned = 0
        self._builds_started = 0

    def __call__(self, stage: Stage, message: str) -> None:
        self._done = max(self._done, int(stage))  # a stage with nothing to do is skipped, never gone back to
        if self._sink is not None:
            self._sink(message, self._done, len(Stage))

    def build(self, label: str) -> None:
        """A planned build starts: numbered among the plan's builds."""
        self._builds_started += 1
        self(Stage.BUILD, f"{label}: converting, {self._builds_started} of {self.builds_planned}")


GOLDEN_SAMPLES = 8
MAX_VALIDATION_SAMPLES = 512


@dataclass
class _Built:
    planned: PlannedVariant
    artifact: ConvertedArtifact
    result: ValidationResult
    convert_s: float
    kept_float: int = 0
    ladder_role: LadderRole = "speed"
    latency_basis: str = ""
    task: Any = None  # end_to_end.py's TaskAccuracy, when the end-to-end gate ran

    # What converters/speed_gate.py reads.
    @property
    def format(self) -> ModelFormat:
        return self.planned.format

    @property
    def precision(self) -> Precision:
        return self.planned.precision

    @property
    def latency_ms(self) -> float | None:
        return self.result.measurements.latency_p50_ms

    @property
    def validated(self) -> bool:
        return self.result.accuracy is not None


def _mb(size: int) -> float:
    return size / 2**20


def _prepare_out(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} already exists and is not empty; choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))


def _finish_out(staging: Path, out: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp made it private; the result is an ordinary directory
    if out.exists():
        out.rmdir()  # empty (checked above)
    os.replace(staging, out)


class _Run:
    """One conversion: holds the source, the data and the report being assembled."""

    def __init__(
        self,
        source: SourceModel,
        data: dict[str, np.ndarray],
        calibration: dict[str, np.ndarray] | None,
        metric: Metric,
        gate: float,
        work: Path,
        progress: _Steps,
        asked: Mapping[str | None, OutputMetric] | None = None,
        user_gate: float | None = None,
    ) -> None:
        self.source = source
        self.data = data
        self.calibration = calibration
        self.metric = metric
        self.gate = gate
        self.work = work
        self.progress = progress
        with quiet_native():
            self.reference = reference_outputs(source, data)
            if calibration is not None and source.layout.state_pairs:
                self.calibration = calibration_states(source, calibration)
        #: Each output's metric, chosen on the reference outputs (output_metrics.resolve).
        self.metrics = resolve(self.reference, asked or {}, user_gate)
        self.decisions: list[str] = []
        self.rejected: list[RejectedVariant] = []
        self._ranking: list[str] | None = None
        self.unsupported: dict[ModelFormat, str] = {}
        self.fp32_sizes: dict[ModelFormat, int] = {}
        self.trials: list[RecipeTrial] = []

    def trial(
        self, planned: PlannedVariant, method: str | None, built: _Built | None, outcome: str, reason: str
    ) -> None:
        """One line of the report's recipe table: every build that was validated, kept or not."""
        self.trials.append(recipe_trial(planned.format, planned.precision, method, built, outcome, reason))

    def build(self, planned: PlannedVariant, method: str | None, keep_float: Sequence[str] = ()) -> _Built:
        converter = as_is_converter(planned) if planned.converter == AS_IS else get_converter(planned.converter)
        tag = f"{planned.id}-{method or 'default'}-{len(keep_float)}"
        request = ConversionRequest(
            self.source,
            planned.precision,
            self.work / tag,
            method=method,
            calibration=self.calibration,
            keep_float=tuple(keep_float),
            metrics=self.metrics,
        )
        started = time.perf_counter()
        with quiet_native():
            artifact = converter.convert(request)
        convert_s = time.perf_counter() - started
        artifact = self._checked(planned, artifact)
        if planned.numeric_validation:
            with quiet_native():
                result = validate_numeric(
                    planned.runtime.value,
                    artifact.files,
                    self.data,
                    self.reference,
                    metric=self.metric,
                    gate=self.gate,
                    options=planned.options,
                    layout=self.source.layout,
                    metrics=self.metrics,
                )
        else:
            from edgesdk.converters.coreml_backend import validate_spec

            result = validate_spec(artifact, self.source)
        if result.stream_drift:
            d = result.stream_drift
            self.decisions.append(
                f"{planned.id}" + (f" ({method})" if method else "") + f": state fed back over {len(d)} steps, "
                f"max |diff| vs the reference step 1 {d[0]:.3g}, step {len(d)} {d[-1]:.3g}, worst {max(d):.3g}"
            )
        return _Built(planned, artifact, result, convert_s, kept_float=len(keep_float))

    def _checked(self, planned: PlannedVariant, artifact: ConvertedArtifact) -> ConvertedArtifact:
        """An fp32 artifact sets the size an int8 one must beat; an int8 one must be int8, an fp16 one fp16."""
        from edgesdk.converters.precision_check import check_fp16, check_int8

        if planned.converter == AS_IS:
            return artifact  # its precision was read from its ops (prebuilt.native_precision)
        if planned.precision == Precision.FP32:
            self.fp32_sizes[planned.format] = artifact.size
        elif planned.precision == Precision.FP16:
            check_fp16(planned.format, artifact.files, self.fp32_sizes.get(planned.format, artifact.size))
        elif planned.precision == Precision.INT8:
            fp32_size = self.fp32_sizes.get(planned.format, self.source.onnx_path.stat().st_size)
            onnx_source = self.source.onnx_path if self.source.kind in ("onnx", "pytorch") else None
            notes = check_int8(planned.format, artifact.files, fp32_size, onnx_source)
            if notes:
                artifact = dataclasses.replace(artifact, notes=[*artifact.notes, *notes])
        return artifact

    def _reject(self, planned: PlannedVariant, reason: str) -> None:
        self.rejected.append(RejectedVariant(format=planned.format, precision=planned.precision, reason=reason))
        self.decisions.append(f"{planned.id} dropped: {reason}")

    def ranking(self) -> list[str]:
        if self._ranking is None:
            from edgesdk.converters.sensitivity import rank_layers

            if not self.calibration:
                self._ranking = []
            else:
                with quiet_native():
                    ranked = rank_layers(self.source, self.calibration, self.work / "sensitivity")
                self._ranking = [name for name, _ in ranked]
                if ranked:
                    top = ", ".join(f"{n} (+{s:.3f})" for n, s in ranked[:3])
                    self.decisions.append(f"int8 sensitivity (added relative error per layer, measured): {top}")
        return self._ranking

    def repair(self, planned: PlannedVariant, method: str, failed: _Built) -> tuple[_Built | None, str]:
        """Keep the most sensitive layers in float, doubling their number, then whole blocks
        around them, until the gate holds.

        Stops at half of the quantizable layers: past that, int8 no longer buys its size.
        Returns the repaired variant (or None) and what was tried, for the report.
        """
        if planned.converter not in CONVERTERS:
            return None, ""  # --as-is: nothing to repair
        if self.source.kind not in ("onnx", "pytorch"):
            # The sensitivity ranking and the kept-float layers are read from an ONNX graph.
            return None, f"not repaired: repair reads an ONNX graph and this source is a {self.source.kind} file"
        from edgesdk.converters.sensitivity import block_rounds

        if not repairable(planned.converter, method):
            return None, ""
        converter = get_converter(planned.converter)
        quantizable = converter.quantizable_layers(self.source)
        allowed = set(quantizable)
        ranking = [n for n in self.ranking() if n in allowed]
        limit = len(ranking) // 2
        rounds: list[tuple[str, list[str]]] = []
        count = 1
        while ranking and count <= limit:
            rounds.append((f"the {count} most sensitive layer(s)", ranking[:count]))
            count *= 2
        seen = {tuple(keep) for _, keep in rounds}
        for blocks, keep in block_rounds(ranking, quantizable, limit):
            if tuple(keep) not in seen:
                seen.add(tuple(keep))
                rounds.append((f"block(s) {blocks} ({len(keep)} layers)", keep))
        tried: list[str] = []
        for what, keep in rounds:
            self.progress(Stage.BUILD, f"{planned.id}: repair, {what} in float")
            built = self.build(planned, method, keep)
            accuracy = built.result.accuracy
            if accuracy is not None and accuracy.passed:
                self.decisions.append(
                    f"{planned.id} ({method}) repaired: {_fmt_metric(failed)} missed the gate; keeping "
                    f"{what} in float ({', '.join(keep)}) gives {_fmt_metric(built)}"
                )
                return built, ""
            self.trial(planned, method, built, "dropped", f"repair with {what} in float missed the gate")
            tried.append(f"{what}: {_fmt_metric(built)}" if accuracy else f"{what}: n/a")
        if not tried:
            return None, ""
        return None, f"repair kept layers in float ({'; '.join(tried)}) without reaching the gate"

    def build_or_reject(self, planned: PlannedVariant) -> _Built | None:
        """:meth:`build_variant`, with any failure of this variant (a converter's or a runtime's
        exception of any type) rejecting it in one line: the other variants still ship."""
        try:
            return self.build_variant(planned)
        except Exception as exc:  # noqa: BLE001 - toolchains raise anything; one variant must not lose the rest
            self._reject(planned, f"failed: {type(exc).__name__}: {one_line(str(exc))}")
            return None

    def build_variant(self, planned: PlannedVariant) -> _Built | None:
        """Build every method of the plan entry, repair misses, and keep the fastest that holds the gate."""
        candidates: list[tuple[str | None, _Built]] = []
        failed: list[tuple[str | None, _Built]] = []
        misses: list[str] = []
        if planned.format in self.unsupported:
            self._reject(planned, self.unsupported[planned.format])
            return None
        for method in planned.methods:
            label = f"{planned.id}" + (f" ({method})" if method else "")
            self.progress.build(label)
            try:
                built = self.build(planned, method)
            except UnsupportedOpError as exc:
                # The op is missing from the format, whatever the precision: say it once per variant.
                self.unsupported[planned.format] = str(exc)
                self._reject(planned, str(exc))
                return None
            except EdgeSDKError as exc:
                # A runtime's refusal at validation can span lines (OpenVINO's C++ frames): one line.
                misses.append(f"{method or planned.precision.value} failed: {one_line(str(exc))}")
                self.trial(planned, method, None, "failed", one_line(str(exc)) if str(exc) else type(exc).__name__)
                continue
            accuracy = built.result.accuracy
            if accuracy is not None and not accuracy.passed:
                failed.append((method, built))
                self.trial(planned, method, built, "dropped", f"missed the gate: {_fmt_metric(built)}")
                continue
            candidates.append((method, built))
        # Repair only when no method holds the gate as is, best-scoring miss first, and stop
        # at the first repair that holds it: every round is a quantization plus a validation.
        failed.sort(key=lambda item: _score(item[1]), reverse=True)
        to_repair = [m for m, _ in failed if repairable(planned.converter, m)]
        for method, built in failed:
            repaired, tried = (None, "not repaired: another method holds the gate") if candidates else (None, "")
            if not candidates and to_repair and method != to_repair[0]:
                # Each round is a quantization plus a validation (minutes on a real convnet):
                # only the recipe closest to the gate is repaired.
                tried = f"not repaired: {to_repair[0]} was closer to the gate and was repaired instead"
            elif not candidates:
                repaired, tried = self.repair(planned, method or "", built)
            if repaired is not None:
                candidates.append((method, repaired))
                continue
            misses.append(
                f"{method or planned.precision.value}: {_fmt_metric(built)}" + (f"; {tried}" if tried else "")
            )
        if not candidates:
            self._reject(planned, "; ".join(misses) or "no method produced a variant")
            return None
        self._record_choice(planned, candidates)
        for miss in misses:
            self.decisions.append(f"{planned.id}: {miss}")
        if len(candidates) > 1:
            ordered = sorted(candidates, key=lambda c: c[1].result.measurements.latency_p50_ms or float("inf"))
            best_method, best = ordered[0]
            for method, other in ordered[1:]:
                a = best.result.measurements.latency_p50_ms or 0.0
                b = other.result.measurements.latency_p50_ms or 0.0
                self.decisions.append(
                    f"{planned.id}: measured {best_method} {a:.3f} ms vs {method} {b:.3f} ms median (batch 1, "
                    f"{planned.runtime.value}): keep {best_method}, drop {method} ({b / a if a else float('nan'):.2f}× slower)"
                )
            return best
        return candidates[0][1]

    def _record_choice(self, planned: PlannedVariant, candidates: list[tuple[str | None, _Built]]) -> None:
        """Mark the candidates in the recipe table: the fastest that holds the gate is kept."""
        ordered = sorted(candidates, key=lambda c: c[1].result.measurements.latency_p50_ms or float("inf"))
        best = ordered[0][1].result.measurements.latency_p50_ms or 0.0
        for index, (method, built) in enumerate(ordered):
            if index == 0:
                reason = "holds the gate" + (", fastest of those that do" if len(ordered) > 1 else "")
                self.trial(planned, method, built, "kept", reason)
            else:
                mine = built.result.measurements.latency_p50_ms or 0.0
                self.trial(planned, method, built, "dropped",
                           f"holds the gate but {mine / best if best else float('nan'):.2f}x the kept one's latency")  # fmt: skip


def recipe_trial(
    fmt: ModelFormat, precision: Precision, method: str | None, built: _Built | None, outcome: str, reason: str
) -> RecipeTrial:
    accuracy = built.result.accuracy if built else None
    return RecipeTrial(
        format=fmt,
        precision=precision,
        method=method,
        kept_float=built.kept_float if built else 0,
        accuracy=None if accuracy is None else round(accuracy.value, 6),
        lower_bound=None if accuracy is None else accuracy.lower_bound,
        verdict=None if accuracy is None else accuracy.verdict,
        size=built.artifact.size if built else None,
        latency_p50_ms=built.result.measurements.latency_p50_ms if built else None,
        outcome=outcome,  # type: ignore[arg-type]
        reason=reason,
    )


def _score(built: _Built) -> float:
    """Higher is closer to the gate, whatever the metrics: the worst output's margin, relative."""
    accuracy = built.result.accuracy
    if accuracy is None:
        return float("-inf")
    margins = [
        (o.threshold - o.value) / max(o.threshold, 1e-12) if o.metric in ("abs", "max_abs") else o.value - o.threshold
        for o in built.result.output_accuracy
    ]
    if margins:
        return min(margins)
    return -accuracy.value if accuracy.metric == "max_abs" else accuracy.value


def _fmt_metric(built: _Built) -> str:
    """The outputs that missed their gate (every output when none did), each with its figure."""
    accuracy = built.result.accuracy
    if accuracy is None:
        return "not measured"
    judged = built.result.output_accuracy
    if judged:
        missed = [o for o in judged if not o.passed]
        return "; ".join(o.note for o in (missed or judged))
    if accuracy.metric == "top1":
        return f"top-1 agreement {accuracy.value:.2%} vs gate {accuracy.gate:.0%}"
    op = ">" if accuracy.metric == "max_abs" else "<"
    return f"{accuracy.metric} {accuracy.value:.6g} {op if not accuracy.passed else 'vs'} gate {accuracy.gate:g}"


def _example_from(
    calibration: Mapping[str, np.ndarray] | None,
    validation: Mapping[str, np.ndarray] | None,
    example: Mapping[str, np.ndarray] | None,
    batch_axes: Mapping[str, int | str] | None,
) -> dict[str, np.ndarray] | None:
    if example:
        return dict(example)
    for data in (calibration, validation):
        if data:
            return first_sample({k: v for k, v in data.items() if k != LABEL_KEY}, batch_axes)
    return None


def convert(
    model: Any,
    profile: DeviceProfile | str,
    out: Path | str,
    *,
    calibration: Path | str | Mapping[str, np.ndarray] | None = None,
    validation: Path | str | Mapping[str, np.ndarray] | None = None,
    metric: str | Mapping[str, str | OutputMetric] | Sequence[str] = "auto",
    gate: float | None = None,
    formats: Collection[ModelFormat | str] | None = None,
    precisions: Collection[Precision | str] | None = None,
    name: str | None = None,
    output_names: Sequence[str] | None = None,
    example: Mapping[str, np.ndarray] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    int8_methods: Collection[str] | None = None,
    profiles_dirs: Sequence[str] = (),
    progress: Progress | None = None,
    batch_axes: Mapping[str, int | str] | None = None,
    as_is: bool = False,
    state_pairs: Mapping[str, str] | None = None,
    end_to_end: Any = None,
) -> ConversionReport:
    """Convert ``model`` (``.onnx`` path, ``"module:factory"`` or ``nn.Module``) for ``profile`` into ``out``.

    The data keeps the model's own layout; ``batch_axes`` (input or output name → axis, or
    ``"none"`` for a constant) says where the samples are where the model's dims do not.
    ``end_to_end`` (end_to_end.TaskCheck) gates every variant on the user's raw files too."""
    disable_vendor_telemetry()
    say = _Steps(progress)
    if isinstance(profile, str):
        from edgesdk.profiles import get_profile

        profile = get_profile(profile, profiles_dirs)
    wanted_formats, wanted_precisions = _wanted_variants(formats, precisions)
    asked = requested_metrics(metric)  # UsageError on an unknown kind or a bad threshold
    out = Path(out)
    raw_calibration, cal_where = _data_from(calibration, "calibration")
    raw_validation, val_where = _data_from(validation, "validation")
    staging = _prepare_out(out)
    work = Path(tempfile.mkdtemp(prefix="edgesdk-convert-"))
    try:
        say(Stage.READ, "reading the model")
        with quiet_native():
            source = load_source(
                model,
                work,
                example=_example_from(raw_calibration, raw_validation, example, batch_axes),
                name=name,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                batch_axes=batch_axes,
            )
        source, cal, val, decisions = _arrange_data(
            source, raw_calibration, cal_where, raw_validation, val_where, batch_axes, state_pairs
        )
        decisions = [*source.notes, *decisions]
        val = _check_validation_data(cal, val, user_gave_validation=bool(raw_validation), decisions=decisions)
        chosen, threshold = _golden_gate(asked, gate, source, decisions)
        family = _model_family(source, decisions)
        plan = _plan_variants(
            profile, source, as_is, cal is not None, wanted_formats, wanted_precisions, int8_methods, family
        )
        say.builds_planned = sum(len(p.methods) for p in plan.variants)
        say(Stage.REFERENCE, "computing reference outputs")
        run = _Run(source, val, cal, chosen, threshold, work / "variants", say, asked, gate)
        per_output = [f"output {n}: {m.describe()} ({m.why})" for n, m in run.metrics.items()]
        run.decisions = decisions + per_output + plan.decisions
        run.rejected = list(plan.rejected)
        built = [b for b in (run.build_or_reject(p) for p in plan.variants) if b is not None]
        if end_to_end is not None:
            built = _gate_end_to_end(run, built, end_to_end)
        _measure_batch1_memory(run, built)
        shipped = _apply_budgets(run, built, profile)
        _compare_latency(run, shipped)
        run.decisions += assign_roles(shipped, profile, model=source.name)
        if not shipped:
            raise _nothing_ships(run, built, plan, source.name, profile.name)
        say(Stage.REPORT, "writing the report")
        report = _write(staging, run, shipped, profile, family.value, end_to_end)
        _finish_out(staging, out)
        return report
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wanted_variants(
    formats: Collection[ModelFormat | str] | None, precisions: Collection[Precision | str] | None
) -> tuple[set[ModelFormat] | None, set[Precision] | None]:
    """--formats and --precisions as enums; UsageError listing the known ones on a bad name."""
    try:
        wanted_formats = {ModelFormat(f) for f in formats} if formats else None
        wanted_precisions = {Precision(p) for p in precisions} if precisions else None
    except ValueError as exc:
        raise UsageError(
            f"{exc}; formats: {', '.join(f.value for f in ModelFormat)}; precisions: "
            f"{', '.join(p.value for p in Precision)}"
        ) from exc
    return wanted_formats, wanted_precisions


def _data_from(
    value: Path | str | Mapping[str, np.ndarray] | None, what: str
) -> tuple[dict[str, np.ndarray] | None, str]:
    """The samples (from an .npz path or in memory) and where they came from, for the report."""
    if value is None:
        return None, ""
    if isinstance(value, Mapping):
        return {k: np.asarray(v) for k, v in value.items()}, f"(in-memory {what} data)"
    return load_npz(value, what), str(value)


def _check_validation_data(
    cal: dict[str, np.ndarray] | None,
    val: dict[str, np.ndarray],
    *,
    user_gave_validation: bool,
    decisions: list[str],
) -> dict[str, np.ndarray]:
    """Validation data disjoint from calibration (UsageError on overlap) when the user gave
    both, and limited to MAX_VALIDATION_SAMPLES."""
    if user_gave_validation and cal:
        repeated = check_disjoint(cal, val)  # UsageError on overlap
        decisions.append(
            "calibration and validation data are disjoint (SHA-256 per sample)"
            + (f"; validation repeats {repeated} of its own samples" if repeated else "")
        )
    if next(iter(val.values())).shape[0] > MAX_VALIDATION_SAMPLES:
        val = subset(val, MAX_VALIDATION_SAMPLES)
        decisions.append(f"validation limited to the first {MAX_VALIDATION_SAMPLES} samples")
    return val


def _golden_gate(
    asked: dict[str | None, OutputMetric], gate: float | None, source: SourceModel, decisions: list[str]
) -> tuple[Metric, float]:
    """The one metric and gate of the bundle's golden check on the device (the per-output
    metrics are chosen by _Run)."""
    everywhere = asked.get(None)
    legacy = everywhere is not None and everywhere.kind in DEFAULT_GATES
    chosen: Metric = everywhere.kind if legacy else choose_metric(source.outputs)  # type: ignore[assignment,union-attr]
    threshold = gate if gate is not None else DEFAULT_GATES[chosen]
    decisions.append(
        f"metric {chosen}, gate {threshold:g} for the bundle's golden check on the device"
        + (" (chosen from the output shape)" if not asked else "")
        + "; each output's own gate follows"
    )
    decisions.append(minimum_samples_sentence(chosen, threshold))
    return chosen, threshold


def _model_family(source: SourceModel, decisions: list[str]) -> Family:
    """The model's family (it picks the int8 recipes), with the reason in the decisions."""
    if source.kind in ("onnx", "pytorch"):
        family, family_reason = detect_family(source.onnx_path)
    else:  # a .tflite or OpenVINO IR source: the recipes read ONNX graphs
        family, family_reason = Family.OTHER, f"not read from a {source.kind} source (the default recipes apply)"
    decisions.append(f"model family {family.value}: {family_reason}")
    return family


def _plan_variants(
    profile: DeviceProfile,
    source: SourceModel,
    as_is: bool,
    has_calibration: bool,
    wanted_formats: set[ModelFormat] | None,
    wanted_precisions: set[Precision] | None,
    int8_methods: Collection[str] | None,
    family: Family,
) -> Plan:
    """The variants to build: the source as it is (--as-is), or the planner's formats × ladder."""
    from edgesdk.runtimes import available_runtimes

    if as_is:
        return as_is_plan(profile, source, available_runtimes())
    return make_plan(
        profile,
        refuse_quantized_source(source),
        has_calibration=has_calibration,
        formats=wanted_formats,
        precisions=wanted_precisions,
        host_runtimes=available_runtimes(),
        int8_methods=int8_methods,
        family=family,
    )


def _nothing_ships(run: _Run, built: list[_Built], plan: Plan, model: str, device: str) -> EdgeSDKError:
    """The error when no variant can ship: every rejection grouped by format and reason, as the
    class that says why (an unsupported op, the budgets, nothing planned, or the accuracy gate)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in run.rejected:
        grouped.setdefault((r.format.value, r.reason), []).append(r.precision.value)
    tried = "; ".join(f"{fmt} {'/'.join(ps)}: {reason}" for (fmt, reason), ps in grouped.items())
    tried = tried or "nothing was planned"
    error: type[EdgeSDKError] = AccuracyGateError
    if run.unsupported:
        error = UnsupportedOpError
    elif built:
        # Variants were built and passed their gate, so _apply_budgets dropped every one.
        error = BudgetError
    elif not plan.variants:
        error = ConversionError
    return error(f"no variant of {model} can ship to {device}: {tried}")


def _gate_end_to_end(run: _Run, built: list[_Built], check: Any) -> list[_Built]:
    """The end-to-end gate (end_to_end.py): a variant whose labels miss the user's does not ship."""
    from edgesdk.converters.end_to_end import gate_variants

    def reject(b: _Built, reason: str) -> None:
        run.rejected.append(RejectedVariant(format=b.planned.format, precision=b.planned.precision, reason=reason))
        run.decisions.append(f"{b.planned.id} {reason}")

    run.progress(Stage.BUILD, f"end to end: {len(check.files)} files through the pipeline, per variant")
    return gate_variants(check, built, run.source.inputs, reject, run.decisions.append)


def _apply_budgets(run: _Run, built: list[_Built], profile: DeviceProfile) -> list[_Built]:
    budget_mb = profile.storage.max_artifact_mb
    ram_mb = profile.memory.model_ram_budget_mb
    footprints = runtime_footprints(profile)  # what devices measured each runtime's import to take
    kept = []
    for b in built:
        size_mb = _mb(b.artifact.size)
        peak = b.result.measurements.peak_rss_mb  # at batch 1, in a fresh process: _measure_batch1_memory
        footprint = footprints.get(b.planned.runtime.value)
        runtime_mb = footprint.rss_mb if footprint is not None and footprint.rss_mb is not None else 0.0
        reason = None
        if size_mb > budget_mb:
            reason = f"{b.planned.precision.value} dropped: {size_mb:.1f} MB > artifact budget {budget_mb:g} MB (by {size_mb - budget_mb:.1f} MB)"
        elif peak is not None and peak + runtime_mb > ram_mb:
            with_runtime = f" + {runtime_mb:.0f} MB {b.planned.runtime.value} after import" if runtime_mb else ""
            reason = (
                f"{b.planned.precision.value} dropped: peak memory {peak:.0f} MB{with_runtime} > RAM budget {ram_mb} MB"
            )
        if reason:
            run.rejected.append(RejectedVariant(format=b.planned.format, precision=b.planned.precision, reason=reason))
            run.decisions.append(f"{b.planned.id} {reason}")
        else:
            kept.append(b)
    return kept


def _measure_batch1_memory(run: _Run, built: list[_Built]) -> None:
    """Each variant's memory at batch 1 in a fresh process (batch1_memory.py), into its
    measurements: the figure the RAM budget and the agent read, whatever the validation batch was."""
    from edgesdk.converters.batch1_memory import batch1_peak_mb
    from edgesdk.converters.validate import host_options

    feeds = run.source.layout.feed(subset(run.data, 1))
    for b in built:
        measured = b.result.measurements
        if measured.peak_rss_mb is None:
            continue  # not run here (spec-only validation)
        runtime = b.planned.runtime.value
        try:
            peak = batch1_peak_mb(runtime, b.artifact.files, host_options(runtime, b.planned.options), feeds)
        except ConversionError as exc:  # one variant's probe never loses the others
            run.decisions.append(f"{b.planned.id}: {exc}; its peak memory is the in-process figure")
            continue
        note = measured.note.replace("load + one batch-1 inference", "load + one batch-1 inference in a fresh process")
        b.result.measurements = measured.model_copy(update={"peak_rss_mb": round(peak, 2), "note": note})


def _compare_latency(run: _Run, shipped: list[_Built]) -> None:
    """Tell, per runtime, how int8 and fp16 compare with fp32 in speed on this host.

    The variants of one runtime are timed again together, round-robin, so that the ratio is
    not skewed by whatever else the host was doing while each was validated.
    """
    from edgesdk.converters.validate import latency_side_by_side

    by_format: dict[ModelFormat, dict[Precision, _Built]] = {}
    for b in shipped:
        by_format.setdefault(b.planned.format, {})[b.planned.precision] = b
    for variants in by_format.values():
        numeric = {p: b for p, b in variants.items() if b.result.accuracy is not None}
        if len(numeric) < 2:
            continue
        run.progress(Stage.TIMING, f"{next(iter(numeric.values())).planned.format.value}: timing variants side by side")
        with quiet_native():
            timed = latency_side_by_side(
                {
                    b.planned.id: (b.planned.runtime.value, b.artifact.files, b.planned.options)
                    for b in numeric.values()
                },
                run.data,
                layout=run.source.layout,
            )
        for b in numeric.values():
            p50, p95 = timed[b.planned.id]
            b.result.measurements = b.result.measurements.model_copy(
                update={"latency_p50_ms": p50, "latency_p95_ms": p95}
            )
    for fmt, variants in by_format.items():
        base = variants.get(Precision.FP32)
        if base is None or not base.result.measurements.latency_p50_ms:
            continue
        for precision in (Precision.FP16, Precision.INT8):
            other = variants.get(precision)
            if other is None or not other.result.measurements.latency_p50_ms:
                continue
            ratio = other.result.measurements.latency_p50_ms / base.result.measurements.latency_p50_ms
            verdict = "faster" if ratio < 0.95 else "SLOWER" if ratio > 1.05 else "about the same"
            line = f"{fmt.value}: {precision.value}/fp32 median latency {ratio:.2f} on this host ({verdict})"
            if ratio > 1.05 and precision == Precision.INT8:
                line += "; shipped for size only: the governor should not step down to it for speed on a CPU like this"
            run.decisions.append(line)


def _write(
    staging: Path, run: _Run, shipped: list[_Built], profile: DeviceProfile, family: str, end_to_end: Any = None
) -> ConversionReport:
    variants = []
    for b in shipped:
        folder = staging / "artifacts" / b.planned.id
        folder.mkdir(parents=True)
        files = []
        for name, path in sorted(b.artifact.files.items()):
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            files.append(target.relative_to(staging).as_posix())
        note = "; ".join([*b.artifact.notes, b.result.measurements.note])
        measurements = b.result.measurements.model_copy(update={"convert_s": round(b.convert_s, 3), "note": note})
        variants.append(
            ShippedVariant(
                id=b.planned.id,
                format=b.planned.format,
                precision=b.planned.precision,
                runtime=b.planned.runtime,
                files=files,
                size=b.artifact.size,
                inputs=b.result.inputs,
                outputs=b.result.outputs,
                accuracy=b.result.accuracy,
                output_accuracy=b.result.output_accuracy,
                quantization_method=b.artifact.method,
                measurements=measurements,
                validation=b.result.validation,
                task_accuracy=b.task,
                ladder_role=b.ladder_role,
                latency_basis=b.latency_basis,
            )
        )
    data = run.data
    if end_to_end is not None and end_to_end.pipeline.folded:  # the graph normalizes: it takes pixels
        from edgesdk.converters.graph_fold import raw_pixels

        first = run.source.inputs[0].name
        data = {**data, first: raw_pixels(np.asarray(data[first]), end_to_end.pipeline.image)}
    golden = golden_set(run.source, data, run.reference, GOLDEN_SAMPLES)
    np.savez_compressed(staging / "golden.npz", **golden)  # type: ignore[arg-type]
    # The drift reference the device compares its traffic with (issue 41), signed in by `edgesdk package`.
    write_profile(staging, data, run.reference, classify=run.metric == "top1", plain=run.source.layout.is_plain)
    report = ConversionReport(
        model_name=run.source.name,
        source=run.source.source,
        profile=profile.name,
        created=datetime.now(timezone.utc),
        metric=run.metric,
        gate=run.gate,
        variants=variants,
        rejected=run.rejected,
        decisions=run.decisions,
        golden="golden.npz",
        family=family,
        recipes=run.trials,
        host_arch=host_arch(),
        device_arch=device_arch(profile),
        end_to_end=None if end_to_end is None else end_to_end.summary,
    )
    (staging / "report.json").write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    from edgesdk.converters.html_report import render_html

    (staging / "report.html").write_text(render_html(report), encoding="utf-8")
    return report
