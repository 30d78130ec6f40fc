"""``edgesdk capture keygen|decrypt``: the operator's side of sampled data capture (issue 41)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import KeyFileError, UsageError

#: A capture file is one request; far larger is not one of ours (and is not read into memory).
MAX_CAPTURE_FILE_BYTES = 1024 * 1024 * 1024


@click.group()
def capture() -> None:
    """Captured requests: make the operator key they are encrypted to, decrypt what devices captured."""


@capture.command("keygen")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for capture.key (0600, keep secret) and capture.pub (for the agents' [capture] table).",
)
@json_option
def keygen(out_dir: Path, as_json: bool) -> None:
    """Make the X25519 key pair capture files are encrypted to."""
    from edgesdk.capture.operator_key import generate_capture_key
    from edgesdk.keys import key_id, load_device_public_key

    private, public = generate_capture_key(out_dir)
    identifier = key_id(load_device_public_key(public))
    if as_json:
        print_json({"private_key": str(private), "public_key": str(public), "key_id": identifier})
        return
    rows = [("private (0600, keep secret)", private), ("public", public), ("key id", identifier)]
    print_table("new capture operator key", ["file", "path"], rows)


@capture.command("decrypt")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--operator-key",
    "key_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The capture.key whose public half the agents encrypt to.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the record here as FILE-stem.npz (in/NAME, out/NAME, meta); without it only describe it.",
)
@json_option
def decrypt(file: Path, key_file: Path, out_dir: Path | None, as_json: bool) -> None:
    """Decrypt one capture file and print what it holds."""
    from edgesdk.capture.record import unpack_record
    from edgesdk.capture.sealed import open_sealed
    from edgesdk.keys import load_device_private_key

    try:
        key = load_device_private_key(key_file)
    except KeyFileError as exc:
        raise UsageError(f"--operator-key: {exc}") from exc
    try:
        if file.stat().st_size > MAX_CAPTURE_FILE_BYTES:
            raise UsageError(f"{file} is over {MAX_CAPTURE_FILE_BYTES} bytes: not a capture file")
        data = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror or exc}") from exc
    plaintext = open_sealed(data, key, source=str(file))
    record = unpack_record(plaintext, source=str(file))
    written = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = out_dir / f"{file.name.removesuffix('.edgecap')}.npz"
        written.write_bytes(plaintext)
    summary = _summary(record.inputs, record.outputs, record.meta, written)
    if as_json:
        print_json(summary)
        return
    rows = [(k, v) for k, v in summary["meta"].items()]
    rows += [(f"input {n}", d) for n, d in summary["inputs"].items()]
    rows += [(f"output {n}", d) for n, d in summary["outputs"].items()]
    if written is not None:
        rows.append(("written to", str(written)))
    print_table(str(file), ["field", "value"], rows)


def _summary(inputs: dict[str, Any], outputs: dict[str, Any], meta: dict[str, Any], written: Path | None) -> dict:
    def shape(array: np.ndarray) -> str:
        return f"{array.dtype}{list(array.shape)}"

    return {
        "meta": meta,
        "inputs": {n: shape(a) for n, a in inputs.items()},
        "outputs": {n: shape(a) for n, a in outputs.items()},
        "written": str(written) if written is not None else None,
    }
