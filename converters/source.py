"""Reading the model to convert: an ``.onnx`` file, a ``module:factory`` or an ``nn.Module``.

Whatever comes in, the result is a :class:`SourceModel` with an fp32 ONNX file (exported from
PyTorch with named inputs/outputs and a dynamic batch axis) and, for PyTorch, the module.
The reference outputs every variant is validated against come from PyTorch for a PyTorch
model and from onnxruntime for an ONNX file.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from edgesdk.converters.base import SourceModel

from edgesdk.errors import EdgeSDKError, ModelError, UnsupportedOpError
from edgesdk.schemas.manifest import TensorSpec

ONNX_OPSET = 17
_ONNX_DTYPES = {
    1: "float32",
    10: "float16",
    11: "float64",
    3: "int8",
    2: "uint8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
}


def _value_info_spec(value: Any) -> TensorSpec:
    tensor = value.type.tensor_type
    dtype = _ONNX_DTYPES.get(tensor.elem_type)
    if dtype is None:
        raise ModelError(f"model tensor {value.name!r} has an element type edgesdk cannot handle ({tensor.elem_type})")
    return TensorSpec(name=value.name, dtype=dtype, shape=[_dim(d) for d in tensor.shape.dim])


def _dim(dim: Any) -> int | str | None:
    """One ONNX dimension: a size, a symbolic name, or None (dynamic, unnamed).

    Every dynamic marker reads as dynamic: a ``dim_param`` name, nothing set, and the
    ``dim_value`` of -1 (or 0) that paddle2onnx and some tf2onnx exports write for "any size"."""
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    if dim.HasField("dim_param") and dim.dim_param.strip():
        return str(dim.dim_param)
    return None


def check_onnx_ops(model: Any, where: str) -> None:
    """Every node's op must exist in ONNX (or onnxruntime's contrib domain): name the first that does not."""
    import onnx

    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for index, node in enumerate(model.graph.node):
        domain = node.domain or "ai.onnx"
        if domain in ("ai.onnx", "ai.onnx.ml"):
            version = opsets.get(domain, ONNX_OPSET)
            try:
                onnx.defs.get_schema(node.op_type, version, "" if domain == "ai.onnx" else domain)
            except onnx.defs.SchemaError as exc:
                label = node.name or f"#{index}"
                raise UnsupportedOpError(
                    f"model {where}: node {label!r} uses op {node.op_type!r}, which ONNX opset {version} does not define"
                ) from exc
        elif domain != "com.microsoft":
            label = node.name or f"#{index}"
            raise UnsupportedOpError(
                f"model {where}: node {label!r} uses op {domain}::{node.op_type}, a custom domain no target can express"
            )


def read_onnx(path: Path, workdir: Path) -> tuple[Path, list[TensorSpec], list[TensorSpec], list[str]]:
    """Check and copy an ONNX file into ``workdir`` with its weights embedded and held as
    initializers (constant_weights.py); the last item says what was changed, for the report."""
    import onnx
    from edgesdk.converters.constant_weights import fold_constant_weights

    if not path.is_file():
        raise ModelError(f"model {path}: file not found")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - protobuf and onnx raise many types
        raise ModelError(f"model {path}: not a readable ONNX file ({type(exc).__name__})") from exc
    if not model.graph.node:
        raise ModelError(f"model {path}: the ONNX graph has no nodes")
    check_onnx_ops(model, str(path))
    folded = fold_constant_weights(model)
    notes = [f"folded {folded} Constant weights into initializers (the quantizers and onnx2torch read weights there)"]
    initializers = {i.name for i in model.graph.initializer}
    inputs = [_value_info_spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_value_info_spec(v) for v in model.graph.output]
    copy = workdir / "source.onnx"
    onnx.save_model(model, str(copy))  # weights embedded: every runtime loads it from bytes
    return copy, inputs, outputs, notes if folded else []


def import_factory(spec: str) -> Any:
    """``"package.module:factory"`` → the ``nn.Module`` the factory returns."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        from edgesdk.converters.prebuilt import ACCEPTED

        raise ModelError(f"model {spec!r}: expected {ACCEPTED}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # let a factory next to the user's working dir be found, like python -m
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelError(f"model {spec!r}: module {module_name!r} has no callable {attr!r}")
    try:
        built = factory()
    except Exception as exc:  # noqa: BLE001 - user code
        raise ModelError(f"model {spec!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    return built


class _NamedOutputs:
    """Calls a module with named inputs and returns its outputs as a tuple, in output order."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        out = self.module(*args)
        if isinstance(out, Mapping):
            return tuple(out.values())
        if isinstance(out, (tuple, list)):
            return tuple(out)
        return (out,)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def export_torch(
    module: Any,
    example: Mapping[str, np.ndarray],
    output_names: Sequence[str] | None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None,
    workdir: Path,
    where: str,
    batch_axes: Mapping[str, int | str] | None = None,
) -> tuple[Path, list[str]]:
    """``torch.onnx.export`` (TorchScript exporter, opset 17) with a dynamic batch axis by default."""
    import torch
    from torch.onnx.errors import OnnxExporterError

    args = tuple(torch.from_numpy(np.array(v)) for v in example.values())
    try:
        with torch.no_grad():
            first = _NamedOutputs(module)(*args)
    except Exception as exc:  # noqa: BLE001 - user code
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in example.items())
        raise ModelError(
            f"model {where}: it raised {type(exc).__name__} on the example inputs ({shapes}): {_first_line(exc)}"
        ) from exc
    names = list(output_names or (["output"] if len(first) == 1 else [f"output_{i}" for i in range(len(first))]))
    if len(names) != len(first):
        raise ModelError(f"model {where}: it returns {len(first)} outputs but {len(names)} output names were given")
    # Axis 0 of every input and output is the batch unless --batch-axis says another (or none,
    # and a 0-d input has none); ``dynamic_axes`` adds more (e.g. sequence).
    declared = dict(batch_axes or {})
    axes: dict[str, dict[int, str]] = {}
    for n in [*example, *names]:
        axis = declared.get(n, 0)
        if isinstance(axis, int) and (n not in example or example[n].ndim > axis):
            axes[n] = {axis: "batch"}
    for tensor, extra in (dynamic_axes or {}).items():
        axes.setdefault(tensor, {}).update(extra)
    path = workdir / "source.onnx"
    try:
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(example),
            output_names=names,
            dynamic_axes={k: dict(v) for k, v in axes.items()},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    except OnnxExporterError as exc:
        # The TorchScript exporter's own errors (UnsupportedOperatorError, SymbolicValueError, and
        # the plain base for "not implemented for opset N") all mean: ONNX cannot express an op.
        raise UnsupportedOpError(f"model {where}: ONNX export failed: {_first_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - tracing runs user code, which raises anything
        raise ModelError(f"model {where}: ONNX export failed: {_first_line(exc)}") from exc
    return path, names


def load_source(
    model: Any,
    workdir: Path,
    *,
    example: Mapping[str, np.ndarray] | None = None,
    name: str | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    batch_axes: Mapping[str, int | str] | None = None,
) -> SourceModel:
    """Read ``model`` (path to .onnx, ``"module:factory"`` or ``nn.Module``) into a SourceModel.

    ``example`` (input name → one batch) is needed for PyTorch models: it names the inputs and
    fixes their dtypes and the static shapes that formats without dynamic shapes use.
    """
    from edgesdk.converters.prebuilt import ACCEPTED, is_prebuilt_path, read_prebuilt

    if is_prebuilt_path(model):
        return read_prebuilt(Path(str(model)), workdir, name)
    if isinstance(model, (str, Path)) and str(model).endswith(".onnx"):
        path = Path(model)
        onnx_path, inputs, outputs, notes = read_onnx(path, workdir)
        from edgesdk.converters.data import synthetic_inputs
        from edgesdk.converters.input_spec import resolve_layout

        layout = resolve_layout(inputs, outputs, None, batch_axes)
        feeds = dict(example) if example else layout.feed(synthetic_inputs(inputs, 1, layout=layout))
        return SourceModel(
            name=name or path.stem,
            source=str(path),
            onnx_path=onnx_path,
            inputs=inputs,
            outputs=outputs,
            example={k: np.array(v) for k, v in feeds.items()},
            layout=layout,
            notes=notes,
        )
    if isinstance(model, (str, Path)):
        where = str(model)
        if Path(where).exists() or ":" not in where:
            raise ModelError(f"model {where!r}: expected {ACCEPTED}")
        module = import_factory(where)
        default_name = where.rpartition(":")[2]
    else:
        module = model
        where = type(model).__name__
        default_name = where.lower()
    try:
        import torch
    except ImportError as exc:
        raise ModelError(f"model {where}: PyTorch models need torch (pip install 'edgesdk[convert]')") from exc
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"model {where}: expected an nn.Module, got {type(module).__name__}")
    if not example:
        raise ModelError(
            f"model {where}: a PyTorch model needs example inputs (calibration/validation data or --input)"
        )
    module = module.eval()
    from edgesdk.converters.input_spec import first_sample

    example = first_sample(example, batch_axes)  # one sample, in the model's layout
    onnx_path, names = export_torch(module, example, output_names, dynamic_axes, workdir, where, batch_axes)
    _, inputs, outputs, notes = read_onnx(onnx_path, workdir)
    return SourceModel(
        name=name or default_name,
        source=where,
        onnx_path=onnx_path,
        inputs=inputs,
        outputs=outputs,
        example=example,
        torch_module=module,
        notes=notes,
    )


def calibration_states(source: SourceModel, calibration: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stateful model's calibration streams as single steps with the states the source reached
    (stateful.calibration_steps); other calibration data as it is."""
    from edgesdk.converters.stateful import calibration_steps

    if not source.layout.state_pairs or not source.layout.steps(calibration):
        return dict(calibration)
    return calibration_steps(source.layout, calibration, reference_outputs(source, calibration))


def reference_outputs(source: SourceModel, data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the source model says for sample-major ``data`` (sample-major too): PyTorch for a
    module, onnxruntime for ONNX, the file's own runtime for a prebuilt one, fed in the model's
    own layout (a stateful model's streams step by step, its state fed back: stateful.py)."""
    from edgesdk.converters.stateful import run_all

    layout = source.layout
    size = layout.batch_size(source.inputs)
    if source.torch_module is not None:
        import torch

        wrapped = _NamedOutputs(source.torch_module)

        def run_torch(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            values = wrapped(*(torch.from_numpy(np.asarray(feeds[s.name])) for s in source.inputs))
            return {s.name: v.detach().numpy() for s, v in zip(source.outputs, values)}

        with torch.no_grad():
            return run_all(run_torch, layout, data, size)
    from edgesdk.runtimes import load_model

    if source.kind in ("tflite", "openvino"):
        from edgesdk.converters.prebuilt import reference_model
        from edgesdk.converters.validate import _dequantize, _quantize

        session: Any = reference_model(source)
        out_specs = {s.name: s for s in source.outputs}
        in_specs = {s.name: s for s in source.inputs}

        def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            raw = session.run({k: _quantize(v, in_specs[k]) for k, v in feeds.items()})
            return {k: _dequantize(v, out_specs.get(k)) for k, v in raw.items()}

    else:
        try:
            session = load_model("onnxruntime", source.onnx_path.read_bytes())
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"model {source.source}: onnxruntime cannot run it: {exc}") from exc
        run = session.run
    runtime = {"tflite": "LiteRT", "openvino": "OpenVINO"}.get(source.kind, "onnxruntime")
    try:
        return run_all(run, layout, data, size)
    except EdgeSDKError as exc:
        shapes = ", ".join(f"{s.name} {s.shape}" for s in source.inputs)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ModelError(
            f"model {source.source}: {runtime} cannot run it on the data (the model takes {shapes}): {first}"
        ) from exc
    finally:
        session.close()
