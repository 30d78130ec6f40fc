#!/usr/bin/env bash
# Embedded developer: convert MobileNetV2 (ImageNet weights) for a Raspberry Pi 5 and a Jetson
# Orin Nano, each with a validated precision ladder, then sign and encrypt one bundle per device.
#
#   examples/embedded_developer/convert_and_package.sh [--quick] [OUT_DIR]
#
# --quick converts to ONNX fp32 + fp16 only (what the test suite runs; ONNX Runtime static int8
# misses the 95% top-1 gate on MobileNetV2 and its repair search takes minutes); without it each profile
# gets every format and precision it supports (ONNX, TFLite, OpenVINO ... fp32, fp16, int8).
# Needs the converter extras: pip install 'edgesdk[all,dev]' (scripts/bootstrap does it).
set -euo pipefail

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT=${1:-mobilenet-out}
EDGESDK=${EDGESDK:-edgesdk}
PYTHON=${PYTHON:-python}
PROFILES=(rpi5-8gb jetson-orin-nano-8gb)
mkdir -p "$OUT"

echo "==> 1. calibration and validation data (real photos bundled with scikit-image)"
"$PYTHON" - "$OUT/data" <<'PY'
import sys
from pathlib import Path
from edgesdk.workloads.mobilenet import prepare_mobilenet
data = prepare_mobilenet(Path(sys.argv[1]))
print(f"{len(data.names)} photos: {data.calibration}, {data.validation}")
PY

echo "==> 2. keys: one publisher key (signs), one key pair per device (decrypts)"
[ -f "$OUT/keys/publisher/publisher.key" ] || "$EDGESDK" keys publisher --out "$OUT/keys/publisher"
for profile in "${PROFILES[@]}"; do
  # On a real device the agent makes this pair itself (edge-agent key prints the public half).
  [ -f "$OUT/keys/$profile/device.pub" ] || "$EDGESDK" keys device --out "$OUT/keys/$profile"
done

for profile in "${PROFILES[@]}"; do
  echo "==> 3. convert for $profile"
  selection=()
  if [ "$QUICK" = 1 ]; then selection=(--formats onnx --precisions fp32,fp16); fi
  rm -rf "$OUT/convert-$profile"
  "$EDGESDK" convert edgesdk.workloads.mobilenet:pretrained_mobilenet_v2 \
    --profile "$profile" --out "$OUT/convert-$profile" \
    --calibration "$OUT/data/calibration.npz" --validation "$OUT/data/validation.npz" \
    --output-names logits --name mobilenet-v2 --gate 0.95 "${selection[@]}"

  echo "==> 4. package for $profile: signed by the publisher, encrypted to the device's key"
  "$EDGESDK" package "$OUT/convert-$profile" --name mobilenet-v2 --version 1.0.0 --release 1 \
    --publisher-key "$OUT/keys/publisher/publisher.key" --recipient "$OUT/keys/$profile/device.pub" \
    --out "$OUT/mobilenet-v2-$profile.edgepkg"

  echo "==> 5. verify as the device would (signature, target profile, decrypt in memory)"
  "$EDGESDK" bundle verify "$OUT/mobilenet-v2-$profile.edgepkg" \
    --publisher-pub "$OUT/keys/publisher/publisher.pub" --device-key "$OUT/keys/$profile/device.key" \
    --profile "$profile"
done

echo
echo "conversion reports: $OUT/convert-*/report.html"
echo "bundles:            $(ls "$OUT"/*.edgepkg | tr '\n' ' ')"
