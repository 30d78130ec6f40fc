"""Embedded developer: a streaming (stateful) model — converted from data in its own layout,
validated over streams with its state fed back, packaged, and served by a real agent with the
client carrying the state from one chunk to the next.

    python examples/embedded_developer/streaming_model.py [OUT_DIR]

The model is a small GRU voice-activity detector (PyTorch, untrained weights from a fixed seed:
what matters here is the interface). Per chunk it takes ``frame [batch, 40]`` (40 filterbank
features) and the GRU state ``h0 [1, batch, 32]`` — the batch on axis 1, as nn.GRU lays it out —
and returns ``prob [batch, 1]`` and the next state ``hn``. edgesdk finds the pair h0 → hn by
name; the data file keeps each array in the model's layout: ``frame`` with a leading step axis
``[T, N, 40]`` (one stream per sample) and the initial state ``h0 [1, N, 32]``. Needs
pip install 'edgesdk[convert,agent]'.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import edgesdk
from edgesdk.keys import generate_publisher_key

PROFILE = "rpi5-8gb"
STEPS, STREAMS, FEATURES, HIDDEN = 12, 16, 40, 32


class StreamingVAD(nn.Module):
    """One chunk: GRU cell over 40 features, then a speech probability."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gru = nn.GRU(FEATURES, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, frame: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, hn = self.gru(frame[None], h0)  # one time step: [1, batch, 40]
        return torch.sigmoid(self.head(out[0])), hn


def streams(count: int, seed: int) -> dict[str, np.ndarray]:
    """Feature streams in the model's own layout: frame [T, N, 40], h0 [1, N, 32] (zeros: a fresh stream)."""
    rng = np.random.default_rng(seed)
    loudness = np.sin(np.linspace(0, 3 * np.pi, STEPS))[:, None, None]  # speech comes and goes
    frame = (rng.standard_normal((STEPS, count, FEATURES)) + 2 * loudness).astype(np.float32)
    return {"frame": frame, "h0": np.zeros((1, count, HIDDEN), np.float32)}


def start_agent(config: Path, data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    agent = os.environ.get("EDGE_AGENT", str(Path(sys.executable).parent / "edge-agent"))
    (data_dir / "api.port").unlink(missing_ok=True)
    proc = subprocess.Popen([agent, "run", "--config", str(config)], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    for _ in range(600):
        port = data_dir / "api.port"
        if port.exists() and port.read_text().strip():
            return proc, f"http://127.0.0.1:{port.read_text().strip()}"
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited:\n{log.read_text()}")
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the agent did not start in 60 s")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "streaming-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = StreamingVAD().eval()
    np.savez(out / "streams.npz", **streams(STREAMS, seed=1))

    print(f"==> 1. convert for {PROFILE}: ONNX + OpenVINO fp32/fp16, every stream run with its state fed back")
    shutil.rmtree(out / "convert", ignore_errors=True)
    report = edgesdk.convert(
        model,
        PROFILE,
        out=out / "convert",
        calibration=out / "streams.npz",
        formats="onnx,openvino",
        precisions="fp32,fp16",
        name="vad",
        output_names=["prob", "hn"],
        batch_axes={"h0": 1, "hn": 1},  # nn.GRU's state has the batch on axis 1
        # One chunk of one stream, for the export (the data file holds whole streams).
        example={"frame": np.zeros((1, FEATURES), np.float32), "h0": np.zeros((1, 1, HIDDEN), np.float32)},
    )
    for line in report.decisions:
        if "fed back" in line:
            print(f"    {line}")
    for variant in report.variants:
        print(f"    {variant.id}: cosine over the streams {variant.accuracy.value:.6f}")

    print("==> 2. a device: the agent's config and its own key; the bundle encrypted to it")
    device = out / "device"
    shutil.rmtree(device, ignore_errors=True)  # a fresh device each run (reinstalling release 1 is a refused rollback)
    data_dir = device / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    keys = out / "keys"
    if not (keys / "publisher.key").exists():
        generate_publisher_key(keys)
    config = device / "agent.toml"
    config.write_text(
        f'device_id = "streaming-example"\nprofile = "{PROFILE}"\ndata_dir = "{data_dir}"\n'
        f'publisher_keys = ["{keys / "publisher.pub"}"]\nlog_format = "text"\n\n[api]\nhost = "127.0.0.1"\nport = 0\n'
    )
    agent_cli = [os.environ.get("EDGE_AGENT", str(Path(sys.executable).parent / "edge-agent"))]
    if not (data_dir / "device.pub").exists():
        subprocess.run([*agent_cli, "key", "--config", str(config)], check=True, capture_output=True)
    bundle = edgesdk.package(
        report,
        version="1.0.0",
        release=1,
        publisher_key=keys / "publisher.key",
        recipients=[data_dir / "device.pub"],
        out=out / "vad-1.0.0.edgepkg",
    )
    subprocess.run([*agent_cli, "install", "--config", str(config), str(bundle)], check=True, capture_output=True)

    print("==> 3. serve it: the client passes the state (each answer's hn is the next request's h0)")
    proc, url = start_agent(config, data_dir, device / "agent.log")
    try:
        stream = streams(1, seed=7)
        h0 = stream["h0"]
        reference_h = torch.from_numpy(h0)
        worst = 0.0
        with edgesdk.AgentClient(url) as client:
            for step in range(STEPS):
                answer = client.infer("vad", {"frame": stream["frame"][step], "h0": h0})
                h0 = answer["hn"]  # carried to the next chunk
                with torch.no_grad():
                    prob, reference_h = model(torch.from_numpy(stream["frame"][step]), reference_h)
                worst = max(worst, float(np.abs(answer["prob"] - prob.numpy()).max()))
                print(f"    chunk {step:2d}: speech probability {float(answer['prob'][0, 0]):.3f}")
            variant = client.status()["model"]["variant"]
        print(f"    served by {variant}; max |difference| from PyTorch over the stream: {worst:.2g}")
        if worst > 1e-4:
            raise SystemExit(f"the served stream drifted from the PyTorch model by {worst}")
        print("STREAM OK")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
