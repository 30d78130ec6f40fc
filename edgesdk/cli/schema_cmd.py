"""``edgesdk schema export DIR``: JSON Schema for every edgesdk document."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import UsageError
from edgesdk.schemas import EXPORTED_SCHEMAS


@click.group()
def schema() -> None:
    """JSON Schema of profiles, manifests, agent config and MQTT payloads."""


def export_schemas(out_dir: Path) -> list[Path]:
    """Write one ``NAME.schema.json`` per exported model; return the paths written."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"schema export: {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in EXPORTED_SCHEMAS.items():
        document = model.model_json_schema()
        document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        document["$id"] = f"https://edgesdk.dev/schemas/{name}.schema.json"
        path = out_dir / f"{name}.schema.json"
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


@schema.command("export")
@click.argument("out_dir", type=click.Path(path_type=Path))
@json_option
def export(out_dir: Path, as_json: bool) -> None:
    """Write JSON Schema documents into OUT_DIR."""
    written = export_schemas(out_dir)
    if as_json:
        print_json([str(p) for p in written])
    else:
        print_table(None, ["schema", "file"], [(p.name.removesuffix(".schema.json"), p) for p in written])
