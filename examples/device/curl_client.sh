#!/usr/bin/env bash
# Call a running edge-agent's local API with curl: health, status, model, one inference.
#
#   examples/device/curl_client.sh http://127.0.0.1:8470
set -euo pipefail
URL=${1:-http://127.0.0.1:8470}

echo "--> GET /v1/status (excerpt)"
status=$(curl -fsS "$URL/v1/status")
echo "${status:0:400}"

echo "--> GET /v1/models (excerpt)"
models=$(curl -fsS "$URL/v1/models")
echo "${models:0:400}"

echo "--> POST /v1/models/digits/infer (JSON: one 8x8 image, a hand-drawn zero)"
curl -fsS -X POST "$URL/v1/models/digits/infer" \
  -H 'Content-Type: application/json' \
  -d '{"inputs": {"image": [[[
        [0, 0, 0.3, 0.8, 0.8, 0.3, 0, 0],
        [0, 0.3, 0.9, 0.3, 0.3, 0.9, 0.3, 0],
        [0, 0.6, 0.6, 0, 0, 0.6, 0.6, 0],
        [0, 0.8, 0.3, 0, 0, 0.3, 0.8, 0],
        [0, 0.8, 0.3, 0, 0, 0.3, 0.8, 0],
        [0, 0.6, 0.6, 0, 0, 0.6, 0.6, 0],
        [0, 0.3, 0.9, 0.3, 0.3, 0.9, 0.3, 0],
        [0, 0, 0.3, 0.8, 0.8, 0.3, 0, 0]]]]}}'
echo

echo "--> GET /metrics (Prometheus, excerpt)"
metrics=$(curl -fsS "$URL/metrics")
grep -E '^edgesdk_agent_(inferences_total|inference_latency_seconds)' <<<"$metrics"
