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
# as_is_convert, new_device, package_and_install, start_agent: the steps tflite_as_is.sh shares
source "$HERE/as_is_steps.sh"

if [ -z "${MODEL:-}" ]; then
  MODEL="$OUT/okay_nabu.tflite"
  "$PYTHON" -c "from pathlib import Path; from edgesdk.workloads.wakeword import wakeword_tflite; wakeword_tflite(Path('$OUT'))"
fi
echo "==> 1. convert --as-is: the .tflite as it is, validated in LiteRT"
as_is_convert 8 >/dev/null

echo "==> 2. a device (its config and key pair); the bundle: the model + keyword_spotter.yaml, signed"
new_device keyword-spotter-example
package_and_install "$OUT/okay_nabu.edgepkg" --pipeline "$HERE/keyword_spotter.yaml" >/dev/null

echo "==> 3. the agent answers each WAV; pymicro-wakeword's detector answers the same file"
start_agent
"$PYTHON" - "$URL" "$HERE" <<'PY'
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
