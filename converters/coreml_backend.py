"""Core ML ``.mlpackage``: coremltools from ``torch.jit.trace``; fp16 compute; int8 weights.

Core ML predicts only on macOS. On other hosts variants are *unvalidated*: the
package is read back without compiling it (``skip_model_load``) and its input/output names,
shapes and dtypes are checked against the source model, with an op histogram and the size.
The report says plainly that no numerical parity was measured; such a variant is never on
the governor's ladder and is packaged only with ``edgesdk package --allow-unvalidated``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.base import ConversionRequest, ConvertedArtifact, SourceModel
from edgesdk.converters.registry import CONVERTERS
from edgesdk.converters.validate import ValidationResult

from edgesdk.errors import ConversionError, UnsupportedOpError
from edgesdk.schemas.common import Precision
from edgesdk.schemas.report import VariantMeasurements

PACKAGE = "model.mlpackage"


def _package_files(package: Path) -> dict[str, Path]:
    return {f"{PACKAGE}/{p.relative_to(package).as_posix()}": p for p in sorted(package.rglob("*")) if p.is_file()}


class CoreMLConverter:
    name = "coreml"
    capabilities = CONVERTERS["coreml"].capabilities

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        return []

    def _convert(self, source: SourceModel, precision: Precision, workdir: Path) -> Any:
        if source.torch_module is None:
            return self._convert_onnx(source, precision, workdir)
        import coremltools as ct
        import torch

        example = tuple(torch.from_numpy(np.array(v)) for v in source.example.values())
        with torch.no_grad():
            traced = torch.jit.trace(source.torch_module, example)
        inputs = [
            # Core ML has no int64 tensors: ids go in as int32. fp16 models keep float32 I/O.
            ct.TensorType(name=s.name, shape=v.shape, dtype=np.int32 if v.dtype.kind in "iu" else np.float32)
            for s, v in zip(source.inputs, source.example.values())
        ]
        try:
            return ct.convert(
                traced,
                inputs=inputs,
                outputs=[ct.TensorType(name=s.name, dtype=np.float32) for s in source.outputs],
                convert_to="mlprogram",
                compute_precision=ct.precision.FLOAT32 if precision == Precision.FP32 else ct.precision.FLOAT16,
                minimum_deployment_target=ct.target.iOS16,
            )
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            # coremltools reports a missing op translation as a plain RuntimeError/NotImplementedError
            # whose message is the only signal; the matching stays in this adapter.
            if "not implemented" in first.lower() or "unsupported" in first.lower():
                raise UnsupportedOpError(f"coreml cannot express an op of {source.source}: {first}") from exc
            raise ConversionError(f"coremltools conversion of {source.source} failed: {first}") from exc

    def _convert_onnx(self, source: SourceModel, precision: Precision, workdir: Path) -> Any:
        """ONNX route: onnx2coreml on a static-shape, shape-folded copy of the model."""
        try:
            import onnx2coreml
        except ImportError as exc:
            raise ConversionError(
                "coreml from an ONNX model needs onnx2coreml: pip install 'edgesdk[convert-coreml]'"
            ) from exc
        import onnx
        import onnxruntime as ort

        model = onnx.load(str(source.onnx_path))
        # Core ML programs here are static: fix every dynamic dim to the example's, then let
        # onnxruntime's basic optimizer fold the shape arithmetic (Shape/Range) onnx2coreml rejects.
        shapes = {name: value.shape for name, value in source.example.items()}
        for value in model.graph.input:
            if value.name in shapes:
                for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                    if not dim.HasField("dim_value"):
                        dim.ClearField("dim_param")
                        dim.dim_value = int(size)
        for value in model.graph.output:
            dims = value.type.tensor_type.shape.dim
            if dims and not dims[0].HasField("dim_value"):
                dims[0].ClearField("dim_param")
                dims[0].dim_value = 1
        fixed, folded = workdir / "static.onnx", workdir / "folded.onnx"
        onnx.save_model(model, str(fixed))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(fixed), options, providers=["CPUExecutionProvider"])
        try:
            return onnx2coreml.convert(
                str(folded), format="mlpackage", compute_precision="fp32" if precision == Precision.FP32 else "fp16"
            )
        except onnx2coreml.UnsupportedOpError as exc:
            raise UnsupportedOpError(f"coreml cannot express an op of {source.source}: {exc}") from exc
        except onnx2coreml.Onnx2CoreMLError as exc:
            raise ConversionError(f"onnx2coreml failed on {source.source}: {exc}") from exc

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        import coremltools as ct

        request.workdir.mkdir(parents=True, exist_ok=True)
        model = self._convert(request.source, request.precision, request.workdir)
        method: str | None = "fp16-compute" if request.precision == Precision.FP16 else None
        if request.precision == Precision.INT8:
            method = request.method or "linear-weights-int8"
            if method == "linear-weights-int8":
                config = ct.optimize.coreml.OptimizationConfig(
                    global_config=ct.optimize.coreml.OpLinearQuantizerConfig(
                        mode="linear_symmetric", weight_threshold=0
                    )
                )
                model = ct.optimize.coreml.linear_quantize_weights(model, config=config)
            elif method == "palettized-weights-8bit":
                config = ct.optimize.coreml.OptimizationConfig(
                    global_config=ct.optimize.coreml.OpPalettizerConfig(nbits=8, weight_threshold=0)
                )
                model = ct.optimize.coreml.palettize_weights(model, config=config)
            else:
                raise ConversionError(f"unknown coreml int8 method {method!r}; known: {self.capabilities.int8_methods}")
        elif request.precision not in (Precision.FP32, Precision.FP16):
            raise ConversionError(f"coreml converter cannot make {request.precision.value}")
        package = request.workdir / PACKAGE
        model.save(str(package))
        return ConvertedArtifact(_package_files(package), request.precision, method, [])


def op_histogram(spec: Any) -> dict[str, int]:
    """Operations of an ML Program spec, by type."""
    counts: Counter[str] = Counter()

    def walk(block: Any) -> None:
        for op in block.operations:
            counts[op.type] += 1
            for nested in op.blocks:
                walk(nested)

    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            walk(block)
    return dict(counts.most_common())


def validate_spec(artifact: ConvertedArtifact, source: SourceModel) -> ValidationResult:
    """Read the package back without compiling it and check its I/O against the source model."""
    import coremltools as ct

    from edgesdk.runtimes.coreml_backend import spec_tensors

    package = next(iter(artifact.files.values()))
    while package.name != PACKAGE:
        package = package.parent
    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    inputs, outputs = spec_tensors(spec)
    want_in = [s.name for s in source.inputs]
    want_out = [s.name for s in source.outputs]
    if [s.name for s in inputs] != want_in or [s.name for s in outputs] != want_out:
        raise ConversionError(
            f"coreml spec I/O {[s.name for s in inputs]} → {[s.name for s in outputs]} does not match the model's {want_in} → {want_out}"
        )
    for got, example in zip(inputs, source.example.values()):
        if list(got.shape) != list(example.shape):
            raise ConversionError(f"coreml input {got.name!r} has shape {got.shape}; expected {list(example.shape)}")
    histogram = op_histogram(spec)
    ops = ", ".join(f"{k}×{v}" for k, v in list(histogram.items())[:8])
    note = f"unvalidated (spec checked): Core ML predicts only on macOS, no numerical parity measured here; I/O checked; ops: {ops}"
    return ValidationResult(
        accuracy=None,
        measurements=VariantMeasurements(note=note),
        inputs=inputs,
        outputs=outputs,
        validation="unvalidated",
    )
