"""Fold a pipeline's normalization into a Core ML ML Program (``.mlpackage``) as explicit ops.

Core ML's own ``ImageType(scale, bias)`` would make the input an image (a CVPixelBuffer), which
the agent does not feed; so the fold is what graph_fold.py does in ONNX, in MIL: ``mul`` and
``add`` by per-channel constants prepended on the first input of ``main``, every reader of the
input re-pointed to the normalized value, the program saved again by coremltools with no
optimization pass (its precision, fp32 or fp16 compute, and its weights as they were).

Core ML predicts only on macOS, so on this host the fold is checked on the spec: the input
keeps its name, shape and float32 dtype, the outputs are unchanged, and ``mul`` + ``add`` on
the input are the program's first operations. The uint8 cast is not folded: a Core ML
multiarray input takes float32 (or float16, int32), so a ``cast`` pipeline's Core ML variant
keeps its float32 input (its manifest dtype) and the agent hands it float pixels.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.graph_fold import channel_shape, fold_constants

from edgesdk.errors import ConversionError
from edgesdk.schemas.pipeline import ImagePre

#: The ML Program file inside a package; the package is three folders above it.
PROGRAM = "model.mlmodel"


def _first_ops(spec: Any, count: int) -> list[str]:
    """The types of the first ``count`` non-const ops of ``main``."""
    function = spec.mlProgram.functions["main"]
    block = function.block_specializations[function.opset]
    return [op.type for op in block.operations if op.type != "const"][:count]


def fold_coreml_package(package: Path, pre: ImagePre) -> None:
    """Fold ``pre``'s normalization into the ``.mlpackage`` at ``package``, rewritten in place."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_to_program

    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    if not spec.HasField("mlProgram"):
        raise ConversionError("cannot fold normalization into a Core ML neural network: only an ML Program")
    weights = package / "Data" / "com.apple.CoreML" / "weights"
    program = milproto_to_program(spec, spec.specificationVersion, str(weights))
    main = program.functions["main"]
    name, source = next(iter(main.inputs.items()))
    if source.dtype != ct.converters.mil.mil.types.fp32:
        raise ConversionError(
            f"cannot fold normalization into Core ML input {name!r}: it takes {source.dtype}, not fp32"
        )
    a, b = fold_constants(pre, np.float32)
    shape = channel_shape(pre, a.size)
    first = main.operations[0]
    with main:
        scaled = mb.mul(x=source, y=a.reshape(shape), before_op=first, name="fold_normalize_mul")
        normalized = mb.add(x=scaled, y=b.reshape(shape), before_op=first, name="fold_normalize_add")
    main.replace_uses_of_var_after_op(anchor_op=normalized.op, old_var=source, new_var=normalized)
    try:
        folded = ct.convert(
            program,
            convert_to="mlprogram",
            minimum_deployment_target=ct.target(spec.specificationVersion),  # the program's own opsets
            compute_precision=ct.precision.FLOAT32,  # no casts added: an fp16 program keeps its own
            pass_pipeline=ct.PassPipeline.EMPTY,
            skip_model_load=True,
        )
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConversionError(f"coremltools could not save the folded Core ML program: {first}") from exc
    staged = package.with_name(f"{package.stem}.folded.mlpackage")
    folded.save(str(staged))
    _check(spec, ct.models.MLModel(str(staged), skip_model_load=True).get_spec(), name)
    shutil.rmtree(package)
    staged.rename(package)


def _check(before: Any, after: Any, name: str) -> None:
    """The folded spec's I/O is the unfolded one's, and it starts with the fold's ops."""
    if before.description.input != after.description.input or before.description.output != after.description.output:
        raise ConversionError(f"folding changed the Core ML program's inputs or outputs (input {name!r})")
    if _first_ops(after, 2) != ["mul", "add"]:
        raise ConversionError(f"the folded Core ML program starts with {_first_ops(after, 2)}, not mul + add")


def fold_coreml_file(path: Path, pre: ImagePre, cast: bool = False) -> dict[str, Path]:
    """Fold into the package whose ``model.mlmodel`` is at ``path`` (``cast`` is not folded: Core
    ML takes no uint8 tensor; see the module's text); the variant's new file listing."""
    package = path.parents[2]
    if package.suffix != ".mlpackage":
        raise ConversionError(f"cannot fold normalization: {path} is not inside an .mlpackage")
    fold_coreml_package(package, pre)
    return {f"{package.name}/{p.relative_to(package).as_posix()}": p for p in sorted(package.rglob("*")) if p.is_file()}
