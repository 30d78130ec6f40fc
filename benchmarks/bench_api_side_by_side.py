"""The agent against the raw peer under wrk, counting what throughput hides (issue 15,
BENCHMARKS.md, "Local API vs fair peers"): per server, requests/s, CPU per answer and involuntary context
switches per answer, both summed over all its threads from /proc. ``--other-tree DIR`` adds a
second agent run from another checkout (e.g. ``git worktree add /tmp/base HEAD~1``, with
``edgesdk/agent`` and ``edgesdk/converters`` symlinked to its ``agent`` and ``converters``), so a
change can be measured side by side with the code before it; run this from outside the
repository (``cd /tmp``) so that checkout's ``edgesdk`` is the one the second agent imports.

    .venv/bin/python benchmarks/bench_api_side_by_side.py --model mobilenet --body raw --concurrency 1 \
        --rounds 8 --seconds 4 [--other-tree /tmp/base]

``--batched-agent N`` adds this tree's agent with ``api.inline_batch_max = N``.

Rounds interleave the servers and rotate their order; printed: each server's medians and the
agents' per-round throughput ratios to the raw peer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_api  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_and_preemptions(pid: int) -> tuple[int, int]:
    """(CPU clock ticks, involuntary context switches) of process ``pid``, all its threads."""
    ticks = switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text().splitlines()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])
        switches += sum(int(line.split(":")[1]) for line in status if line.startswith("nonvoluntary_ctxt"))
    return ticks, switches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["digits", "mobilenet"], default="mobilenet")
    parser.add_argument("--body", choices=["json", "npy", "raw"], default="raw")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--other-tree", type=Path, help="a checkout whose agent runs beside this one")
    parser.add_argument(
        "--shim",
        type=Path,
        help="with --other-tree: a sitecustomize folder that points the editable install at EDGESDK_TREE "
        "(no symlinks needed; /tmp/helpers/oldcode-shim in the helpers' sessions)",
    )
    parser.add_argument(
        "--batched-agent",
        type=int,
        metavar="N",
        help="also run this tree's agent with api.inline_batch_max = N (batches on the event loop)",
    )
    args = parser.parse_args()
    from tests.agent_helpers import AgentProcess, agent_env

    work = Path(tempfile.mkdtemp(prefix="wrk-threads-"))
    model = bench_api.prepare(work, (args.model,))[args.model]
    path = f"/v1/models/{args.model}/infer"
    agents = [AgentProcess(model["device"]).start()]
    servers = {"agent": (agents[0].port, path, agents[0].proc.pid)}
    if args.other_tree:
        device = bench_api.prepare(work / "other", (args.model,))[args.model]["device"]
        env = agent_env()
        if args.shim:
            env["PYTHONPATH"] = str(args.shim.resolve())
            env["EDGESDK_TREE"] = str(args.other_tree.resolve())
        else:
            env["PYTHONPATH"] = str(args.other_tree.resolve())
        agents.append(AgentProcess(device, env=env).start())
        servers["other agent"] = (agents[1].port, path, agents[1].proc.pid)
    if args.batched_agent:
        device = bench_api.prepare(work / "batched", (args.model,), api={"inline_batch_max": args.batched_agent})
        agents.append(AgentProcess(device[args.model]["device"]).start())
        servers[f"agent, batches of <= {args.batched_agent}"] = (agents[-1].port, path, agents[-1].proc.pid)
    # The peer runs the model with the intra-op threads the agent chose, as in bench_api.py.
    model = bench_api.matched_to_agent(model, bench_api.agent_threads(agents[0].port, args.model))
    peer, port = bench_api.start_peer("raw", model)
    servers["raw"] = (port, "/infer", peer.pid)
    body, headers = bench_api.bodies(model["x"])[args.body]
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers}
    try:
        for round_index in range(args.rounds):
            order = list(servers.items())
            shift = round_index % len(order)
            for name, (server_port, server_path, pid) in order[shift:] + order[:shift]:
                script = bench_api.lua_script(work, f"{name.replace(' ', '-')}-{args.body}", body, headers)
                bench_api.run_wrk(server_port, server_path, script, args.concurrency, 1)
                ticks, switches = cpu_and_preemptions(pid)
                row = bench_api.run_wrk(server_port, server_path, script, args.concurrency, args.seconds)
                after_ticks, after_switches = cpu_and_preemptions(pid)
                answers = max(1, row["answers"])
                rows[name].append(
                    (row["rps"], (after_ticks - ticks) / _TICKS / answers * 1e6, (after_switches - switches) / answers)
                )
            print(f"round {round_index + 1}/{args.rounds} ({bench_api.load_average()})", flush=True)
    finally:
        for agent in agents:
            agent.stop()
        peer.terminate()
        peer.wait(10)
    print(f"\n{args.model}, {args.body} body, c={args.concurrency}, {args.rounds} rounds of {args.seconds} s\n")
    print("| server | req/s | CPU µs per answer | involuntary switches per answer | ÷ raw (per-round median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, measured in rows.items():
        ratio = statistics.median(a[0] / r[0] for a, r in zip(measured, rows["raw"], strict=True) if r[0])
        print(
            f"| {name} | {statistics.median(m[0] for m in measured):.1f} | {statistics.median(m[1] for m in measured):,.0f} "
            f"| {statistics.median(m[2] for m in measured):.2f} | {ratio:.3f} |"
        )
    if "other agent" in rows:
        ratios = [a[0] / o[0] for a, o in zip(rows["agent"], rows["other agent"], strict=True) if o[0]]
        print(
            f"\nagent ÷ other agent, per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
