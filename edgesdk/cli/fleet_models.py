"""``--model`` for ``edgesdk fleet push / status / rollback``: a device may serve several models,
each updated by its own deployments (docs/ota.md, "Several models on one device")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgesdk.errors import UsageError

model_option = click.option(
    "--model",
    "model_name",
    default=None,
    help="The model this concerns (a device may serve several): push checks the bundle is it, status and "
    "rollback keep to its deployments.",
)


def model_of(summary: dict[str, Any]) -> str:
    """The model a deployment summary is for (``model_name``; older summaries: the first word of ``model``)."""
    return str(summary.get("model_name") or str(summary.get("model", "")).split(" ")[0])


def check_bundle_model(bundle: Path, model_name: str | None) -> None:
    """UsageError (one line) when ``--model`` names another model than the bundle is."""
    if model_name is None or not bundle.is_file():
        return
    from edgesdk.bundle import inspect_bundle

    actual = inspect_bundle(bundle).manifest.model.name
    if actual != model_name:
        raise UsageError(f"--model {model_name!r}: bundle {str(bundle)!r} is model {actual!r}")


def keep_model(rows: list[dict[str, Any]], model_name: str | None) -> list[dict[str, Any]]:
    return rows if model_name is None else [r for r in rows if model_of(r) == model_name]


def check_deployment_model(summary: dict[str, Any], model_name: str | None) -> None:
    if model_name is not None and model_of(summary) != model_name:
        raise UsageError(
            f"--model {model_name!r}: deployment {summary['deployment_id']!r} is for model {model_of(summary)!r}"
        )


def latest_of_model(rows: list[dict[str, Any]], model_name: str) -> str:
    """The id of the newest deployment of ``model_name`` (rows oldest first); UsageError when none."""
    mine = keep_model(rows, model_name)
    if not mine:
        raise UsageError(f"--model {model_name!r}: no deployment of that model here")
    return str(mine[-1]["deployment_id"])


def per_model_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """One row per model: its latest deployment (rows oldest first), state and devices by state."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        latest[model_of(row)] = row
    return [
        (
            name,
            r["deployment_id"],
            r["state"],
            ", ".join(f"{k} {v}" for k, v in sorted(r["by_state"].items())),
        )
        for name, r in sorted(latest.items())
    ]
