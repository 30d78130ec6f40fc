"""How far one wrk run can be trusted on this machine (issue 15, BENCHMARKS.md "Fifth session").

Starts the agent and the raw uvloop + httptools peer on the digits CNN as bench_api.py does
(one intra-op thread for both), then runs wrk against each, back to back, ``--repeats`` times
per body and concurrency, printing req/s, p99, the server's CPU per answer (user + system, from
/proc) and its context switches per answer. ``--pin`` puts every thread of both servers on CPU 0
and wrk on CPU 1; ``--strace`` also counts each server's system calls over one c=1 run
(``strace -c -f``, slow: read the calls per answer, not the time).

    .venv/bin/python benchmarks/probe_wrk_spread.py [--bodies raw,json] [--repeats 2] [--pin] [--strace]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_api  # noqa: E402


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def switches(pid: int) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return sum(int(line.split(":")[1]) for line in lines if "ctxt_switches" in line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", default="raw,json")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--pin", action="store_true", help="servers on CPU 0, wrk on CPU 1")
    parser.add_argument("--strace", action="store_true", help="also count system calls over one c=1 run each")
    args = parser.parse_args()
    from tests.agent_helpers import AgentProcess

    ticks = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="wrk-spread-") as tmp:
        work = Path(tmp)
        model = bench_api.prepare(work, ("digits",), (1, False))["digits"]
        agent = AgentProcess(model["device"]).start()
        peer, port = bench_api.start_peer("raw", model)
        servers = {"agent": (agent.port, "/v1/models/digits/infer", agent.proc.pid), "raw": (port, "/infer", peer.pid)}
        try:
            if args.pin:
                for pid in (agent.proc.pid, peer.pid):
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        os.sched_setaffinity(int(task.name), {0})
                wrapper = work / "wrk-on-cpu1"
                wrapper.write_text(f'#!/bin/sh\nexec taskset -c 1 {bench_api.WRK} "$@"\n')
                wrapper.chmod(0o755)
                bench_api.WRK = str(wrapper)
            for repeat in range(args.repeats):
                for body_name in args.bodies.split(","):
                    body, headers = bench_api.bodies(model["x"])[body_name]
                    for concurrency in (1, 16):
                        for name, (server_port, path, pid) in servers.items():
                            script = bench_api.lua_script(work, f"{name}-{body_name}", body, headers)
                            bench_api.run_wrk(server_port, path, script, concurrency, 1)
                            cpu, ctx = cpu_ticks(pid), switches(pid)
                            row = bench_api.run_wrk(server_port, path, script, concurrency, args.seconds)
                            answers = max(1, row["answers"])
                            cpu_us = (cpu_ticks(pid) - cpu) / ticks / answers * 1e6
                            print(
                                f"{repeat + 1} {body_name} c={concurrency} {name}: {row['rps']:,.0f} req/s, "
                                f"p99 {row['p99_ms']:.2f} ms, {cpu_us:.0f} µs CPU and "
                                f"{(switches(pid) - ctx) / answers:.2f} context switches per answer",
                                flush=True,
                            )
            if args.strace:
                body, headers = bench_api.bodies(model["x"])["json"]
                for name, (server_port, path, pid) in servers.items():
                    script = bench_api.lua_script(work, f"{name}-strace", body, headers)
                    out = work / f"strace-{name}.txt"
                    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)])
                    time.sleep(1)
                    row = bench_api.run_wrk(server_port, path, script, 1, 3)
                    tracer.send_signal(signal.SIGINT)
                    tracer.wait()
                    print(f"{name}: {row['answers']} answers (JSON, c=1) under strace -c -f")
                    print(out.read_text())
        finally:
            agent.stop()
            peer.terminate()
            peer.wait(10)


if __name__ == "__main__":
    main()
