# The steps tflite_as_is.sh and keyword_spotter.sh share (sourced by them, not run on its own):
# convert pymicro-wakeword's prebuilt "okay nabu" .tflite as it is, make a fresh device, ship the
# bundle to it and serve it. They read OUT, MODEL, EDGESDK, EDGE_AGENT, PYTHON and PROFILE as
# the sourcing script set them.

# as_is_convert CHUNKS: CHUNKS chunks of random spotter input (3 frames x 40 int8 features) as
# $OUT/frames.npz, then `edgesdk convert --as-is` of $MODEL into $OUT/convert: one variant at
# the precision found in the file, validated in LiteRT on those chunks.
as_is_convert() {
  "$PYTHON" -c "
import numpy as np
np.savez('$OUT/frames.npz', input_audio=np.random.default_rng(0).integers(-128, -90, ($1, 3, 40)).astype(np.int8))"
  rm -rf "$OUT/convert"
  "$EDGESDK" convert "$MODEL" --as-is --profile "$PROFILE" --validation "$OUT/frames.npz" --name okay_nabu --out "$OUT/convert"
}

# new_device DEVICE_ID: a fresh device under $OUT/device (its agent config, its own key pair; a
# second install of release 1 on the old one would be a refused rollback), and the publisher's
# key pair under $OUT/keys (kept between runs).
new_device() {
  rm -rf "$OUT/device"
  mkdir -p "$OUT/device/data" && chmod 700 "$OUT/device/data"
  [ -f "$OUT/keys/publisher.key" ] || "$EDGESDK" keys publisher --out "$OUT/keys" >/dev/null
  cat > "$OUT/device/agent.toml" <<TOML
device_id = "$1"
profile = "$PROFILE"
data_dir = "$OUT/device/data"
publisher_keys = ["$OUT/keys/publisher.pub"]
log_format = "text"

[api]
host = "127.0.0.1"
port = 0
TOML
  "$EDGE_AGENT" key --config "$OUT/device/agent.toml" >/dev/null
}

# package_and_install BUNDLE [PACKAGE_OPTION...]: $OUT/convert as okay_nabu 1.0.0 (release 1),
# signed with the publisher's key and encrypted to the device's, written to BUNDLE and
# installed on the device (the agent verifies and unseals it).
package_and_install() {
  local bundle=$1
  shift
  "$EDGESDK" package "$OUT/convert" --name okay_nabu --version 1.0.0 --release 1 "$@" \
    --publisher-key "$OUT/keys/publisher.key" --recipient "$OUT/device/data/device.pub" --out "$bundle" >/dev/null
  "$EDGE_AGENT" install --config "$OUT/device/agent.toml" "$bundle"
}

# start_agent: the device's agent serving in the background (stopped when the script exits);
# sets URL once its API listens (the agent writes the port it got to data/api.port).
start_agent() {
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
}
