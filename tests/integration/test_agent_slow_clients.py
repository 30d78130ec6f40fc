"""Slow clients cannot starve a real ``edge-agent run`` (issue 37, finding 6): while a crowd of
slowloris connections and slow 16 MiB bodies is held against it (every one the agent closes
opened again at once), the requests of normal clients, on TCP and on the Unix socket, are
answered, not refused with 503.

Scaled down to stay cheap: 60 slowloris connections against ``max_connections = 32`` and 3 slow
16 MiB bodies against a budget of two such bodies (``max_inflight_bytes = 32 MiB``) make the
same pressure as the finding's 300 connections against 256 and 9 bodies against 8. Before the
fix, the connections over the limit were refused (the slowloris crowd held every slot) and two
declared bodies held the whole budget, so every normal request got 503.
benchmarks/bench_slow_clients.py holds the finding's full numbers."""

from __future__ import annotations

import re
import time

import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli
from tests.slow_clients import SlowCrowd

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")

MiB = 1 << 20


def test_normal_requests_are_answered_while_slow_clients_are_held(convert_dir, images, tmp_path) -> None:
    device = make_device(tmp_path)
    socket_path = tmp_path / "agent.sock"
    device.write_config(api={"max_connections": 32, "max_inflight_bytes": 32 * MiB, "unix_socket": str(socket_path)})
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr
    body = {"inputs": {"image": images[:1].tolist()}}
    with AgentProcess(device) as agent:
        crowd = SlowCrowd(("127.0.0.1", agent.port), slowloris=60, bodies=3, declared=16 * MiB, interval_s=0.5)
        statuses: list[int | str] = []
        with crowd:
            # The crowd is in: every slot taken, both bodies declared (63 connects take a while on a
            # loaded machine; a fixed 1.5 s was a guess at how long).
            deadline = time.monotonic() + 60
            while crowd.held() < 32:
                assert time.monotonic() < deadline, f"only {crowd.held()} slow clients held after 60 s"
                time.sleep(0.05)
            for i in range(40):
                transport = httpx.HTTPTransport(uds=str(socket_path)) if i % 2 else None
                with httpx.Client(base_url=agent.url, transport=transport, timeout=10) as client:
                    try:
                        if i % 4 < 2:
                            statuses.append(client.post("/v1/models/digits/infer", json=body).status_code)
                        else:
                            statuses.append(client.get("/healthz").status_code)
                    except httpx.TransportError as exc:
                        statuses.append(type(exc).__name__)
                time.sleep(0.05)
            opened = crowd.opened
        assert opened >= 63, opened  # the crowd was held, not turned away at the door
        answered = statuses.count(200)
        assert answered >= 38, f"{answered} of {len(statuses)} normal requests answered: {statuses}"
        assert 503 not in statuses, statuses
        # The operator sees what happened on /metrics: connections closed to make room, none refused.
        metrics = httpx.get(f"{agent.url}/metrics", timeout=10).text
        evicted = re.search(r"^edgesdk_agent_http_connections_evicted_total (\d+)$", metrics, re.M)
        # Connections past the 32 slots were admitted by closing another (each crowd or normal one at most once).
        assert evicted is not None and 0 < int(evicted[1]) <= crowd.opened + len(statuses), (crowd.opened, metrics)
        assert re.search(r"^edgesdk_agent_http_connections_refused_total 0$", metrics, re.M), metrics
        assert agent.proc.poll() is None, agent.log()
