#!/usr/bin/env bash
# The whole device example: set up a device dir, run the agent, call its API from Python and
# curl, stop the agent (SIGTERM drains requests in flight).
#
#   examples/device/run_example.sh [DEVICE_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-device-example}
EDGE_AGENT=${EDGE_AGENT:-edge-agent}
PYTHON=${PYTHON:-python}

"$HERE/setup_device.sh" "$DIR"
rm -f "$DIR/data/api.port"
"$EDGE_AGENT" run --config "$DIR/agent.toml" > "$DIR/agent.log" 2>&1 &
AGENT=$!
trap 'kill -TERM $AGENT 2>/dev/null || true; wait $AGENT 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  [ -s "$DIR/data/api.port" ] && break
  kill -0 $AGENT 2>/dev/null || { echo "the agent exited:"; cat "$DIR/agent.log"; exit 1; }
  sleep 0.1
done
URL="http://127.0.0.1:$(cat "$DIR/data/api.port")"
echo "==> the agent listens on $URL"

echo "==> Python client"
"$PYTHON" "$HERE/client.py" "$URL"
echo "==> curl"
"$HERE/curl_client.sh" "$URL"
