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
OUT=${1:-tflite-out}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
PROFILE=${PROFILE:-rpi5-8gb}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

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
"$PYTHON" -c "
import numpy as np
np.savez('$OUT/frames.npz', input_audio=np.random.default_rng(0).integers(-128, -90, (40, 3, 40)).astype(np.int8))"

echo "==> 1. convert --as-is: one variant at the precision found in the file, validated in LiteRT"
rm -rf "$OUT/convert"
"$EDGESDK" convert "$MODEL" --as-is --profile "$PROFILE" --validation "$OUT/frames.npz" --name okay_nabu --out "$OUT/convert"

echo "==> 2. a device: its agent config and its own key; the bundle signed and encrypted to it"
rm -rf "$OUT/device"  # a fresh device each run (a second install of release 1 would be a refused rollback)
mkdir -p "$OUT/device/data" && chmod 700 "$OUT/device/data"
[ -f "$OUT/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$OUT/keys" >/dev/null
cat > "$OUT/device/agent.toml" <<TOML
device_id = "tflite-example"
profile = "$PROFILE"
data_dir = "$OUT/device/data"
publisher_keys = ["$OUT/keys/publisher.pub"]
log_format = "text"

[api]
host = "127.0.0.1"
port = 0
TOML
[ -f "$OUT/device/data/device.pub" ] || "$EDGE_AGENT" key --config "$OUT/device/agent.toml" >/dev/null
"$EDGESDK" package "$OUT/convert" --name okay_nabu --version 1.0.0 --release 1 \
  --publisher-key "$OUT/keys/publisher.key" --recipient "$OUT/device/data/device.pub" --out "$OUT/okay_nabu-1.0.0.edgepkg" >/dev/null
"$EDGE_AGENT" install --config "$OUT/device/agent.toml" "$OUT/okay_nabu-1.0.0.edgepkg"

echo "==> 3. serve it and stream 40 chunks of features (the spotter keeps its state between them)"
rm -f "$OUT/device/data/api.port"
"$EDGE_AGENT" run --config "$OUT/device/agent.toml" > "$OUT/device/agent.log" 2>&1 &
AGENT=$!
trap 'kill -TERM $AGENT 2>/dev/null || true; wait $AGENT 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$OUT/device/data/api.port" ] && break
  kill -0 $AGENT 2>/dev/null || { echo "the agent exited:"; cat "$OUT/device/agent.log"; exit 1; }
  sleep 0.1
done
URL="http://127.0.0.1:$(cat "$OUT/device/data/api.port")"
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
