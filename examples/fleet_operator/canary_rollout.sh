#!/usr/bin/env bash
# Fleet operator: enroll devices from the keys they announce, package a model for exactly those
# keys, deliver v1 to the group, then push v2 as a canary rollout (one device first, the rest
# after its probation) and read the deployment's status.
#
#   examples/fleet_operator/canary_rollout.sh [WORK_DIR]
#
# So that it runs anywhere, the "fleet" is local: a mosquitto broker and three edge-agent
# processes in group "lab" (on real hardware: devices flashed with `edgesdk image build`).
# Needs mosquitto (apt-get install mosquitto). Set DIGITS_DIR to reuse a trained digits model.
set -euo pipefail

WORK=${1:-fleet-example}
EDGESDK=${EDGESDK:-edgesdk}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}
MOSQUITTO=${MOSQUITTO:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
PROFILE=rpi5-8gb
DEVICES=(lab-1 lab-2 lab-3)
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
DIGITS_DIR=${DIGITS_DIR:-$WORK/digits}
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# ---------------------------------------------------------------- the lab fleet (simulated) --
PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BROKER="mqtt://127.0.0.1:$PORT"
printf 'listener %s 127.0.0.1\nallow_anonymous true\n' "$PORT" > "$WORK/mosquitto.conf"
"$MOSQUITTO" -c "$WORK/mosquitto.conf" > "$WORK/mosquitto.log" 2>&1 &
PIDS+=($!)

mkdir -p "$WORK/keys"
[ -f "$WORK/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$WORK/keys" >/dev/null
for device in "${DEVICES[@]}"; do
  mkdir -p "$WORK/$device/data" && chmod 700 "$WORK/$device/data"
  cat > "$WORK/$device/agent.toml" <<TOML
device_id = "$device"
profile = "$PROFILE"
data_dir = "$WORK/$device/data"
publisher_keys = ["$WORK/keys/publisher.pub"]
log_format = "text"
[api]
port = 0
[mqtt]
enabled = true
broker = "$BROKER"
groups = ["lab"]
TOML
  rm -f "$WORK/$device/data/api.port"
  "$EDGE_AGENT" run --config "$WORK/$device/agent.toml" > "$WORK/$device/agent.log" 2>&1 &
  PIDS+=($!)
done
echo "==> lab fleet: mosquitto on $BROKER, agents ${DEVICES[*]} (each made its own key pair)"

# ---------------------------------------------------------------------------- the operator --
export EDGESDK_BROKER=$BROKER   # every `edgesdk fleet` command reads the broker from here
REGISTRY="$WORK/enrollment.json"
DB="$WORK/fleet.sqlite3"

echo "==> 1. enrollment requests the devices announced"
for _ in $(seq 1 30); do
  listed=$("$EDGESDK" fleet enroll list --registry "$REGISTRY" --wait 1 --json)
  count=$("$PYTHON" -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$listed")
  [ "$count" -ge "${#DEVICES[@]}" ] && break
done
"$EDGESDK" fleet enroll list --registry "$REGISTRY" --wait 1

echo "==> 2. approve them (in real life: compare the key id with what \`edge-agent key\` shows on the device)"
for device in "${DEVICES[@]}"; do
  key_id=$("$PYTHON" -c 'import json,sys; print(next(r["offered_key_id"] for r in json.loads(sys.argv[1]) if r["device_id"] == sys.argv[2]))' "$listed" "$device")
  "$EDGESDK" fleet enroll approve "$device" --registry "$REGISTRY" --key-id "$key_id" --wait 1
done

echo "==> 3. the model from the developer: digits, converted for $PROFILE"
"$PYTHON" -c "from pathlib import Path; from edgesdk.workloads.digits import prepare_digits; prepare_digits(Path('$DIGITS_DIR'))"
rm -rf "$WORK/convert"
"$EDGESDK" convert "$DIGITS_DIR/digits_cnn.onnx" --profile "$PROFILE" --formats onnx --name digits \
  --calibration "$DIGITS_DIR/calibration.npz" --validation "$DIGITS_DIR/validation.npz" --out "$WORK/convert" >/dev/null

echo "==> 4. package v1 and v2 for every approved device (revoked ones would get no key slot)"
for release in 1 2; do
  "$EDGESDK" package "$WORK/convert" --name digits --version "1.$((release - 1)).0" --release "$release" \
    --publisher-key "$WORK/keys/publisher.key" --recipients-from-registry "$REGISTRY" \
    --out "$WORK/digits-v$release.edgepkg" >/dev/null
done

echo "==> 5. deliver v1 to the whole group"
"$EDGESDK" fleet push "$WORK/digits-v1.edgepkg" --group lab --canary 0% --waves 100% --probation 2s \
  --operator-key "$WORK/keys/publisher.key" --db "$DB" --deployment-id lab-v1

echo "==> 6. v2 as a canary rollout: one device first, the rest once it has passed 5 s of probation"
# Each wave gets its own signed command, addressed to its devices and valid for --expires:
# devices refuse it afterwards, on another device, or replayed (docs/ota.md).
"$EDGESDK" fleet push "$WORK/digits-v2.edgepkg" --group lab --canary 33% --waves 100% \
  --probation 5s --p95-ms 50 --max-failures 0% --expires 1h \
  --operator-key "$WORK/keys/publisher.key" --db "$DB" --deployment-id lab-v2

echo "==> 7. what the deployment database says"
"$EDGESDK" fleet status lab-v2 --db "$DB"
"$EDGESDK" fleet devices --wait 1   # presence + latest telemetry of the group
