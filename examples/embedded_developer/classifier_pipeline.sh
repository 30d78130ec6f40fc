#!/usr/bin/env bash
# Embedded developer: ship a classifier WITH its preprocessing. The pipeline (decode, resize,
# normalize, softmax, labels) is declared in digits_pipeline.yaml, validated end to end against
# your own Python function (my_preprocess.py:predict) on raw image files, signed into the bundle,
# and served by a real agent: a JPEG in, the same label as your code out.
#
#   examples/embedded_developer/classifier_pipeline.sh [OUT_DIR]
#
# DIGITS_DIR reuses an already trained digits model (else one is trained: about a minute).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-classifier-out}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
PROFILE=rpi5-8gb
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DIGITS_DIR=${DIGITS_DIR:-$OUT/digits}
export DIGITS_ONNX="$DIGITS_DIR/digits_cnn.onnx"   # my_preprocess.py reads the model from here

echo "==> 1. the model, and raw validation files: 40 PNGs of handwritten digits, one JPEG to send"
"$PYTHON" - "$DIGITS_DIR" "$OUT" <<'PY'
import sys
from pathlib import Path
import numpy as np
from PIL import Image
from edgesdk.workloads.digits import prepare_digits
digits, out = prepare_digits(Path(sys.argv[1])), Path(sys.argv[2])
(out / "images").mkdir(exist_ok=True)
pixels = np.load(digits.validation)["image"][:41, 0]
pictures = [Image.fromarray(np.rint(p * 255).astype(np.uint8)).resize((32, 32), Image.Resampling.NEAREST) for p in pixels]
for i, picture in enumerate(pictures[:40]):
    picture.save(out / "images" / f"digit-{i:03d}.png")
pictures[40].save(out / "photo.jpg", format="JPEG", quality=90)
PY

echo "==> 2. convert: every variant is gated on tensors AND end to end against my_preprocess.py:predict"
rm -rf "$OUT/convert"
"$EDGESDK" convert "$DIGITS_ONNX" --profile "$PROFILE" --formats onnx --precisions fp32,fp16 --name digits --out "$OUT/convert" \
  --calibration "$DIGITS_DIR/calibration.npz" --validation "$DIGITS_DIR/validation.npz" \
  --pipeline "$HERE/digits_pipeline.yaml" --labels "$HERE/digits_labels.txt" \
  --validation-images "$OUT/images" --reference "$HERE/my_preprocess.py:predict" | grep "end to end"

echo "==> 3. a device (its config and key pair) and the bundle: model + the validated pipeline, signed"
mkdir -p "$OUT/device/data" && chmod 700 "$OUT/device/data"
[ -f "$OUT/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$OUT/keys" >/dev/null
cat > "$OUT/device/agent.toml" <<TOML
device_id = "classifier-example"
profile = "$PROFILE"
data_dir = "$OUT/device/data"
publisher_keys = ["$OUT/keys/publisher.pub"]

[api]
host = "127.0.0.1"
port = 0
TOML
[ -f "$OUT/device/data/device.pub" ] || "$EDGE_AGENT" key --config "$OUT/device/agent.toml" >/dev/null
"$EDGESDK" package "$OUT/convert" --name digits --version 1.0.0 --release 1 \
  --publisher-key "$OUT/keys/publisher.key" --recipient "$OUT/device/data/device.pub" --out "$OUT/digits.edgepkg" \
  --pipeline "$HERE/digits_pipeline.yaml" --labels "$HERE/digits_labels.txt" >/dev/null
"$EDGE_AGENT" install --config "$OUT/device/agent.toml" "$OUT/digits.edgepkg" >/dev/null

echo "==> 4. the agent answers a JPEG; your function answers the same file"
rm -f "$OUT/device/data/api.port"
"$EDGE_AGENT" run --config "$OUT/device/agent.toml" 2>"$OUT/agent.log" &
AGENT=$!
trap 'kill $AGENT 2>/dev/null; wait $AGENT 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$OUT/device/data/api.port" ] && break; sleep 0.1; done
"$PYTHON" - "$OUT" "$HERE" <<'PY'
import sys
from pathlib import Path
from edgesdk.client import AgentClient
out, here = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(here))
from my_preprocess import predict
port = (out / "device" / "data" / "api.port").read_text().strip()
with AgentClient(f"http://127.0.0.1:{port}") as client:
    answer = client.predict("digits", (out / "photo.jpg").read_bytes())
best, (label, score) = answer["labels"][0], predict(str(out / "photo.jpg"))
print(f"agent: {best['label']} ({best['score']:.4f}); my_preprocess.py: {label} ({score:.4f})")
assert best["label"] == label, "the agent's label differs from your function's"
print(f"SAME LABEL {label}")
PY
