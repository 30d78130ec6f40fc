"""The planner: which formats and which precision ladder, from the device profile.

It reads the runtimes the device supports (preferred first), the precisions each runs well,
the accelerators, and what is installed on this host, and returns what to build together
with a sentence for every choice and every rejection. A runtime that does not fit the board
(its footprint, measured on devices of the profile, against the RAM and storage budgets:
runtime_footprint) is not planned. The model budgets are checked after building, when sizes and
memory are measured (see pipeline).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from edgesdk.converters import onnx2tf_route, onnx2torch_route
from edgesdk.converters.base import ConverterCapabilities
from edgesdk.converters.recipes import Family, recipes_for
from edgesdk.converters.registry import CONVERTER_FOR_FORMAT, CONVERTERS, missing_method_packages, missing_packages
from edgesdk.converters.runtime_footprint import runtimes_that_do_not_fit

from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.profile import DeviceProfile, RuntimeSupport
from edgesdk.schemas.report import RejectedVariant


def onnx_to_tflite_missing() -> str | None:
    """None when an ONNX model has a route to TFLite (onnx2torch here, or the onnx2tf venv)."""
    light, heavy = onnx2torch_route.missing_reason(), onnx2tf_route.missing_reason()
    return None if light is None or heavy is None else f"{light}, or {heavy}"


#: Ladder order: the governor steps down this list.
LADDER = (Precision.FP32, Precision.FP16, Precision.INT8)
#: int8 methods that need calibration data (and that repair can keep layers of in float).
STATIC_INT8 = {
    "static-qdq-per-channel",
    "static-qdq-percentile",
    "static-qdq-u8",
    "static-qdq-percentile-u8",
    "static-qdq-weight-matmuls",
    "cle-static-qdq",
    "nncf-qdq",
    "static-int8-full-integer",
    "nncf-ptq",
    "nncf-ptq-bias-correction",
    "nncf-ptq-accuracy-control",
    "nncf-ptq-transformer",
}

#: int8 methods that keep layers in float themselves (validated on the calibration samples):
#: repair does not run them again with more layers kept.
SELF_REPAIRING = {"nncf-ptq-accuracy-control"}


def repairable(converter: str, method: str) -> bool:
    """Whether repair may rebuild ``method`` of ``converter`` with more layers kept in float:
    a calibrated int8 of a converter that supports it, and not one that repairs itself."""
    entry = CONVERTERS.get(converter)
    return (
        entry is not None
        and entry.capabilities.supports_repair
        and method in STATIC_INT8
        and method not in SELF_REPAIRING
    )


@dataclass(frozen=True)
class PlannedVariant:
    converter: str
    format: ModelFormat
    runtime: RuntimeName
    precision: Precision
    #: int8: the methods to build and measure against each other.
    methods: tuple[str | None, ...] = (None,)
    #: Runtime options for validation on this host.
    options: dict[str, str] = field(default_factory=dict)
    numeric_validation: bool = True

    @property
    def id(self) -> str:
        return f"{self.format.value}-{self.precision.value}"


@dataclass
class Plan:
    variants: list[PlannedVariant] = field(default_factory=list)
    rejected: list[RejectedVariant] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)

    def reject(self, fmt: ModelFormat, precision: Precision, reason: str) -> None:
        self.rejected.append(RejectedVariant(format=fmt, precision=precision, reason=reason))
        self.decisions.append(f"{fmt.value} {precision.value} rejected: {reason}")


def _validation_runtime(runtime: RuntimeName) -> RuntimeName:
    # A device on tflite-runtime gets the same .tflite; this host validates in ai-edge-litert,
    # its successor (tflite-runtime does not run with numpy 2).
    return RuntimeName.LITERT if runtime == RuntimeName.TFLITE_RUNTIME else runtime


def _why_precision(profile: DeviceProfile, runtime: RuntimeName, precision: Precision) -> str:
    reason = f"{runtime.value} on {profile.name} lists {precision.value}"
    good_on = [a.name for a in profile.accelerators if precision in a.precisions]
    if good_on:
        reason += f"; {', '.join(good_on)} runs it well"
    return reason


@dataclass(frozen=True)
class _Ask:
    """make_plan's arguments, handed to its steps together."""

    profile: DeviceProfile
    source_kind: str
    has_calibration: bool
    formats: Collection[ModelFormat] | None
    precisions: Collection[Precision] | None
    host_runtimes: Collection[RuntimeName]
    int8_methods: Collection[str] | None
    family: Family


@dataclass(frozen=True)
class _Route:
    """How one format gets made and validated on this host: its converter and validation runtime."""

    fmt: ModelFormat
    support: RuntimeSupport
    converter: str
    caps: ConverterCapabilities
    runtime: RuntimeName
    numeric: bool


def make_plan(
    profile: DeviceProfile,
    source_kind: str,
    *,
    has_calibration: bool,
    formats: Collection[ModelFormat] | None = None,
    precisions: Collection[Precision] | None = None,
    host_runtimes: Collection[RuntimeName] = (),
    int8_methods: Collection[str] | None = None,
    family: Family = Family.OTHER,
) -> Plan:
    """Formats × precision ladder for ``profile``, with the reasoning."""
    ask = _Ask(profile, source_kind, has_calibration, formats, precisions, host_runtimes, int8_methods, family)
    plan = Plan()
    too_big = _note_device_limits(plan, ask)
    unreachable: list[ModelFormat] = []
    for fmt in profile.formats:
        support = profile.runtime_for(fmt)
        if support is None:  # pragma: no cover - formats come from the runtimes
            continue
        if formats and fmt not in formats:
            plan.decisions.append(f"{fmt.value}: skipped, not in --formats")
            continue
        if not _plan_format(plan, ask, fmt, support, too_big):
            unreachable.append(fmt)
    if unreachable:
        plan.decisions.append(_not_offered(source_kind, unreachable))
    return plan


def _note_device_limits(plan: Plan, ask: _Ask) -> dict[RuntimeName, str]:
    """The footprint and measured-speed sentences, and --formats the device does not run;
    returns the runtimes too big for the board (-> why)."""
    profile = ask.profile
    too_big, footprint_lines = runtimes_that_do_not_fit(profile)
    plan.decisions += footprint_lines
    if profile.measured:
        devices = len({m.device_id for m in profile.measured})
        plan.decisions.append(
            f"speed: {profile.name}'s measured: section ({len(profile.measured)} set(s) from {devices} device(s)) "
            "decides the ladder of the models it has, before this host's timings"
        )
    for wanted in ask.formats or ():
        if wanted not in profile.formats:
            plan.reject(
                wanted,
                Precision.FP32,
                f"{profile.name} does not run {wanted.value} (it runs {', '.join(f.value for f in profile.formats)})",
            )
    return too_big


def _plan_format(
    plan: Plan, ask: _Ask, fmt: ModelFormat, support: RuntimeSupport, too_big: dict[RuntimeName, str]
) -> bool:
    """Plans (or rejects) the ladder of one format the device runs. False when no converter takes
    this source to ``fmt`` at all: that is said once for all such formats, not per rung."""
    ladder = _format_ladder(plan, ask, fmt, support, too_big)
    if ladder is None:
        return True
    converter = CONVERTER_FOR_FORMAT.get(fmt)
    if converter is None:
        _reject_ladder(plan, fmt, ladder, f"no converter for {fmt.value}")
        return True
    caps = CONVERTERS[converter].capabilities
    if ask.source_kind not in caps.sources and not (ask.formats and fmt in ask.formats):
        return False
    blocker = _conversion_blocker(ask.source_kind, fmt, converter, caps)
    if blocker:
        _reject_ladder(plan, fmt, ladder, blocker)
        return True
    runtime = _validation_runtime(support.runtime)
    numeric = caps.numeric_validation and runtime in ask.host_runtimes
    if caps.numeric_validation and not numeric:
        _reject_ladder(
            plan,
            fmt,
            ladder,
            f"runtime {runtime.value} is not installed on this host, so the variant cannot be validated",
        )
        return True
    if not numeric:
        plan.decisions.append(
            f"{fmt.value}: {runtime.value} cannot predict on this host; variants are unvalidated: spec checked "
            "(I/O names, shapes, dtypes, op histogram, size), no numerical parity, never on the governor's "
            "ladder, packaged only with --allow-unvalidated"
        )
    route = _Route(fmt, support, converter, caps, runtime, numeric)
    for precision in ladder:
        _plan_rung(plan, ask, route, precision)
    return True


def _reject_ladder(plan: Plan, fmt: ModelFormat, ladder: list[Precision], reason: str) -> None:
    for p in ladder:
        plan.reject(fmt, p, reason)


def _format_ladder(
    plan: Plan, ask: _Ask, fmt: ModelFormat, support: RuntimeSupport, too_big: dict[RuntimeName, str]
) -> list[Precision] | None:
    """The rungs of LADDER the device's runtime lists for ``fmt`` and --precisions keeps, with a
    sentence for each one left out; None when the runtime does not fit the board."""
    ladder = [p for p in LADDER if p in support.precisions]
    if support.runtime in too_big:
        _reject_ladder(plan, fmt, ladder, too_big[support.runtime])
        return None
    for extra in support.precisions:
        if extra not in LADDER:
            plan.reject(fmt, extra, f"no converter makes {extra.value} yet")
    if ask.precisions:
        for p in ladder:
            if p not in ask.precisions:
                plan.decisions.append(f"{fmt.value} {p.value}: skipped, not in --precisions")
        for p in ask.precisions:
            if p not in support.precisions:
                plan.reject(fmt, p, f"{support.runtime.value} on {ask.profile.name} does not list {p.value}")
        ladder = [p for p in ladder if p in ask.precisions]
    return ladder


def _conversion_blocker(source_kind: str, fmt: ModelFormat, converter: str, caps: ConverterCapabilities) -> str | None:
    """Why this host cannot turn a ``source_kind`` model into ``fmt``, or None when it can."""
    no_onnx_route = onnx_to_tflite_missing() if source_kind == "onnx" and converter == "tflite" else None
    if source_kind not in caps.sources or no_onnx_route:
        route = {
            ModelFormat.TFLITE: no_onnx_route or "",
            ModelFormat.COREML: "the ONNX→Core ML route (onnx2coreml) is not installed",
        }.get(fmt, f"{converter} takes {', '.join(caps.sources)} models")
        if source_kind not in caps.sources:
            route = f"{converter} takes {', '.join(caps.sources)} models"
        return f"cannot convert this {source_kind} model to {fmt.value}: {route}; give the PyTorch model (module:factory) instead"
    missing = missing_packages(converter, source_kind)
    if missing:
        return f"converter needs {', '.join(missing)}: pip install 'edgesdk[{caps.extra}]'"
    return None


def _plan_rung(plan: Plan, ask: _Ask, route: _Route, precision: Precision) -> None:
    """Plans one precision of a format (int8: with the methods to build), or rejects it."""
    methods: tuple[str | None, ...] = (None,)
    if precision == Precision.INT8:
        int8 = _int8_methods(plan, ask, route)
        if int8 is None:
            return
        methods = int8
    plan.variants.append(
        PlannedVariant(
            route.converter,
            route.fmt,
            route.runtime,
            precision,
            methods,
            _validation_options(route.runtime, precision),
            numeric_validation=route.numeric,
        )
    )
    plan.decisions.append(
        f"{route.fmt.value} {precision.value} planned: {_why_precision(ask.profile, route.support.runtime, precision)}"
    )


def _int8_methods(plan: Plan, ask: _Ask, route: _Route) -> tuple[str | None, ...] | None:
    """The int8 methods to build for ``route``: the family's recipes (or --int8-method), less those
    whose packages are missing or that need calibration data not given; None when none is left."""
    fmt, converter, caps = route.fmt, route.converter, route.caps
    methods: tuple[str | None, ...] = recipes_for(converter, ask.family, caps.int8_methods)
    if ask.int8_methods:
        # An explicit --int8-method may name a recipe of another family.
        methods = tuple(m for m in caps.int8_methods if m in ask.int8_methods or m in methods)
    for method in methods:
        lacking = missing_method_packages(converter, method)
        if lacking:
            plan.decisions.append(f"{fmt.value} int8: {method} skipped, it needs {', '.join(lacking)}")
    methods = tuple(m for m in methods if not missing_method_packages(converter, m))
    if ask.int8_methods:
        chosen = tuple(m for m in methods if m in ask.int8_methods)
        if not chosen:
            plan.reject(
                fmt,
                Precision.INT8,
                f"none of --int8-method {', '.join(sorted(ask.int8_methods))} applies to {fmt.value} "
                f"(it has {', '.join(caps.int8_methods)})",
            )
            return None
        methods = chosen
    if not ask.has_calibration:
        usable = tuple(m for m in methods if m not in STATIC_INT8)
        if not usable:
            plan.reject(fmt, Precision.INT8, "int8 needs calibration data (--calibration)")
            return None
        plan.decisions.append(f"{fmt.value} int8: no calibration data, so only {', '.join(str(m) for m in usable)}")
        methods = usable
    if len(methods) > 1 and not route.numeric:
        plan.decisions.append(
            f"{fmt.value} int8: speed cannot be measured on this host; building {methods[0]} "
            f"(first in preference), not {', '.join(str(m) for m in methods[1:])}"
        )
        methods = methods[:1]
    if len(methods) > 1:
        plan.decisions.append(
            f"{fmt.value} int8: will build {' and '.join(str(m) for m in methods)} and keep the faster one that holds the gate"
        )
    return methods


def _validation_options(runtime: RuntimeName, precision: Precision) -> dict[str, str]:
    """Runtime options for validating a variant on this host."""
    options: dict[str, str] = {}
    if runtime == RuntimeName.OPENVINO:
        options["device"] = "CPU"
        if precision in (Precision.FP32, Precision.INT8):
            # This CPU may run fp32 IR (and int8 IR's float parts) in bf16 unless told:
            # parity needs f32, and int8 is timed against fp32 on the same float path.
            options["INFERENCE_PRECISION_HINT"] = "f32"
    return options


def _not_offered(source_kind: str, unreachable: list[ModelFormat]) -> str:
    names = ", ".join(f.value for f in unreachable)
    takes = sorted(
        f.value for f, c in CONVERTER_FOR_FORMAT.items() if source_kind in CONVERTERS[c].capabilities.sources
    )
    return (
        f"{names}: not offered for a {source_kind} source, no converter turns a {source_kind} model into "
        f"{names} (a {source_kind} source converts to {', '.join(takes) or 'nothing'}); give the PyTorch or ONNX "
        "model to get them"
    )
