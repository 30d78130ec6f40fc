#!/usr/bin/env bash
# Embedded developer: a keyword spotter that answers a WAV. pymicro-wakeword's prebuilt "okay
# nabu" streaming int8 .tflite is shipped as it is, with its pipeline signed into the bundle
# (keyword_spotter.yaml: WAV -> TFLite-Micro's audio frontend -> the model over 3-frame chunks,
# from its initial state for each WAV -> the mean of 5 calls' probabilities against 0.85), and a
# real agent answers two WAVs (espeak-ng saying "Okay Nabu" and "The weather is nice today.")
# with {detected, probability}. With pymicro-wakeword installed, its own detector answers the
# same WAVs beside the agent.
#
#   examples/embedded_developer/keyword_spotter.sh [OUT_DIR]
#
# The model is read from the pymicro-wakeword 2.5.0 wheel that scripts/bootstrap downloads (or
# set MODEL=path/to/okay_nabu.tflite). Needs pip install 'edgesdk[agent,litert,pipeline]'.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-keyword-spotter-out}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
PROFILE=${PROFILE:-rpi5-8gb}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [ -z "${MODEL:-}" ]; then
  MODEL="$OUT/okay_nabu.tflite"
  "$PYTHON" -c "from pathlib import Path; from edgesdk.workloads.wakeword import wakeword_tflite; wakeword_tflite(Path('$OUT'))"
fi
echo "==> 1. convert --as-is: the .tflite as it is, validated in LiteRT"
"$PYTHON" -c "
import numpy as np
np.savez('$OUT/frames.npz', input_audio=np.random.default_rng(0).integers(-128, -90, (8, 3, 40)).astype(np.int8))"
rm -rf "$OUT/convert"
"$EDGESDK" convert "$MODEL" --as-is --profile "$PROFILE" --validation "$OUT/frames.npz" --name okay_nabu --out "$OUT/convert" >/dev/null

echo "==> 2. a device (its config and key pair); the bundle: the model + keyword_spotter.yaml, signed"
rm -rf "$OUT/device"  # a fresh device each run (a second install of release 1 would be a refused rollback)
mkdir -p "$OUT/device/data" && chmod 700 "$OUT/device/data"
[ -f "$OUT/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$OUT/keys" >/dev/null
cat > "$OUT/device/agent.toml" <<TOML
device_id = "keyword-spotter-example"
profile = "$PROFILE"
data_dir = "$OUT/device/data"
publisher_keys = ["$OUT/keys/publisher.pub"]
log_format = "text"

[api]
host = "127.0.0.1"
port = 0
TOML
"$EDGE_AGENT" key --config "$OUT/device/agent.toml" >/dev/null
"$EDGESDK" package "$OUT/convert" --name okay_nabu --version 1.0.0 --release 1 --pipeline "$HERE/keyword_spotter.yaml" \
  --publisher-key "$OUT/keys/publisher.key" --recipient "$OUT/device/data/device.pub" --out "$OUT/okay_nabu.edgepkg" >/dev/null
"$EDGE_AGENT" install --config "$OUT/device/agent.toml" "$OUT/okay_nabu.edgepkg" >/dev/null

echo "==> 3. the agent answers each WAV; pymicro-wakeword's detector answers the same file"
rm -f "$OUT/device/data/api.port"
"$EDGE_AGENT" run --config "$OUT/device/agent.toml" > "$OUT/device/agent.log" 2>&1 &
AGENT=$!
trap 'kill -TERM $AGENT 2>/dev/null || true; wait $AGENT 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$OUT/device/data/api.port" ] && break
  kill -0 $AGENT 2>/dev/null || { echo "the agent exited:"; cat "$OUT/device/agent.log"; exit 1; }
  sleep 0.1
done
"$PYTHON" - "http://127.0.0.1:$(cat "$OUT/device/data/api.port")" "$HERE" <<'PY'
import sys
from pathlib import Path

from edgesdk.client import AgentClient

url, here = sys.argv[1], Path(sys.argv[2])
try:
    import io, wave
    from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures, Model
except ImportError:
    MicroWakeWord = None  # the usual host code is optional here


def host(wav: bytes) -> str:
    """pymicro-wakeword's own detector on the same 16-bit samples, as a user's host code runs it."""
    if MicroWakeWord is None:
        return "pymicro-wakeword not installed"
    detector, features = MicroWakeWord.from_builtin(Model.OKAY_NABU), MicroWakeWordFeatures()
    with wave.open(io.BytesIO(wav)) as source:
        scores = [detector.process_streaming_prob(f) for f in features.process_streaming(source.readframes(source.getnframes()))]
    best = max(s for s in scores if s is not None)
    return f"pymicro-wakeword: detected={best > detector.probability_cutoff} ({best:.4f})"


with AgentClient(url) as client:
    for name in ("keyword_spotter_okay_nabu.wav", "keyword_spotter_weather.wav"):
        wav = (here / name).read_bytes()
        answer = client.predict("okay_nabu", wav)
        print(f"    {name}: agent: detected={answer['detected']} ({answer['probability']:.4f}, {answer['calls']} calls); {host(wav)}")
        assert answer["detected"] == (name == "keyword_spotter_okay_nabu.wav"), answer
print("SPOTTED okay nabu")
PY
