"""What the trust document costs an agent at start (µs).

At start the daemon reads the document's fields (no crypto, ``load_document``); whoever opens
the bundle (the unseal helper, or the daemon with ``unseal = "in_process"``) checks a threshold
of its root signatures (``verify_self``) before trusting its publisher keys. A trust update
(``verify_update``) checks the old and the new root thresholds. Warm figures are the median of
many calls in this process; "first in a fresh process" is one call in a new interpreter, so it
includes building the schema's validator and the first use of the Ed25519 code.

    .venv/bin/python benchmarks/bench_trust.py [--rounds 500] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from edgesdk.keys import generate_publisher_key, generate_root_key, load_publisher_public_key
from edgesdk.schemas.trust import TrustDocument
from edgesdk.trust import document_bytes, load_document, role_of, sign_document, verify_self, verify_update

_FRESH = """
import sys, time
t0 = time.perf_counter()
from edgesdk.trust import load_document, verify_self
t1 = time.perf_counter()
document = load_document(sys.argv[1])
t2 = time.perf_counter()
verify_self(document)
t3 = time.perf_counter()
print((t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6)
"""


def _document(root: Path, *, version: int, roots: int, threshold: int, signers: int) -> TrustDocument:
    from edgesdk.keys import load_publisher_private_key

    root_keys = []
    for i in range(roots):
        folder = root / f"root-{version}-{i}"
        if not (folder / "root.key").exists():
            generate_root_key(folder)
        root_keys.append(folder)
    publisher = root / "publisher"
    operator = root / "operator"
    for folder in (publisher, operator):
        if not (folder / "publisher.pub").exists():
            generate_publisher_key(folder)
    document = TrustDocument.parse_obj_clear(
        {
            "version": version,
            "expires_at": datetime.now(timezone.utc) + timedelta(days=365),
            "roles": {
                "root": role_of([load_publisher_public_key(f / "root.pub") for f in root_keys], threshold),
                "publisher": role_of([load_publisher_public_key(publisher / "publisher.pub")]),
                "operator": role_of([load_publisher_public_key(operator / "publisher.pub")]),
            },
        },
        source="bench",
    )
    return sign_document(document, [load_publisher_private_key(f / "root.key") for f in root_keys[:signers]])


def _median_us(fn, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for roots, threshold in ((1, 1), (5, 3)):
            document = _document(root, version=1, roots=roots, threshold=threshold, signers=threshold)
            path = root / f"trust-{roots}.json"
            path.write_bytes(document_bytes(document))
            nxt = _document(root, version=2, roots=roots, threshold=threshold, signers=threshold)
            # A rotation: the new document also carries the old root's signatures.
            from edgesdk.keys import load_publisher_private_key

            old_signers = [load_publisher_private_key(root / f"root-1-{i}" / "root.key") for i in range(threshold)]
            rotated = sign_document(nxt, old_signers)
            fresh = subprocess.run(
                [sys.executable, "-c", _FRESH, str(path)], capture_output=True, text=True, check=True
            ).stdout.split()
            rows.append(
                {
                    "root keys": f"{threshold} of {roots}",
                    "bytes": path.stat().st_size,
                    "read fields µs": round(_median_us(lambda p=path: load_document(p), args.rounds), 1),
                    "verify_self µs": round(_median_us(lambda d=document: verify_self(d), args.rounds), 1),
                    "verify_update µs": round(
                        _median_us(lambda d=document, r=rotated: verify_update(d, r), args.rounds), 1
                    ),
                    "fresh process: import ms": round(float(fresh[0]) / 1000, 1),
                    "fresh: read µs": round(float(fresh[1]), 1),
                    "fresh: verify_self µs": round(float(fresh[2]), 1),
                }
            )
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" if c == "root keys" else "---:" for c in columns) + " |")
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
