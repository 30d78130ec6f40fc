#!/usr/bin/env bash
# Make this machine a device: an agent config, the agent's own key pair, and a signed,
# encrypted digits bundle sideloaded into its A/B store (what `edge-agent install` does on a
# real device after a developer hands over a bundle).
#
#   examples/device/setup_device.sh DEVICE_DIR
#
# The developer half (train + convert + package) runs here too so the example is self-contained;
# set DIGITS_DIR to reuse an already trained digits model.
set -euo pipefail

DIR=${1:?usage: setup_device.sh DEVICE_DIR}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
PROFILE=${PROFILE:-rpi5-8gb}
DIGITS_DIR=${DIGITS_DIR:-$DIR/digits}
mkdir -p "$DIR/data"
chmod 700 "$DIR/data"
DIR=$(cd "$DIR" && pwd)

echo "==> developer side: train the digits CNN, convert it for $PROFILE, make a publisher key"
"$PYTHON" -c "from pathlib import Path; from edgesdk.workloads.digits import prepare_digits; prepare_digits(Path('$DIGITS_DIR'))"
rm -rf "$DIR/convert"
"$EDGESDK" convert "$DIGITS_DIR/digits_cnn.onnx" --profile "$PROFILE" --formats onnx --name digits \
  --calibration "$DIGITS_DIR/calibration.npz" --validation "$DIGITS_DIR/validation.npz" --out "$DIR/convert" >/dev/null
[ -f "$DIR/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$DIR/keys" >/dev/null

echo "==> device side: the agent's config"
cat > "$DIR/agent.toml" <<TOML
device_id = "example-device"
profile = "$PROFILE"
data_dir = "$DIR/data"
publisher_keys = ["$DIR/keys/publisher.pub"]
log_format = "text"

[api]
host = "127.0.0.1"
port = ${API_PORT:-0}    # 0: a free port, written to data/api.port (a real device uses 8470)

[governor]
source = "auto"          # sysfs thermal zones, psutil, vcgencmd or Jetson rails: whatever this machine has
TOML

echo "==> device side: the agent makes its own X25519 key pair (the private half never leaves the device)"
"$EDGE_AGENT" key --config "$DIR/agent.toml"

echo "==> developer side: package for that key (signed, encrypted)"
"$EDGESDK" package "$DIR/convert" --name digits --version 1.0.0 --release 1 \
  --publisher-key "$DIR/keys/publisher.key" --recipient "$DIR/data/device.pub" --out "$DIR/digits-1.0.0.edgepkg" >/dev/null

echo "==> device side: sideload it (verify, stage in an A/B slot, prove it loads, commit)"
"$EDGE_AGENT" install --config "$DIR/agent.toml" "$DIR/digits-1.0.0.edgepkg"
echo
echo "now run:  $EDGE_AGENT run --config $DIR/agent.toml"
