"""The whole path from a JPEG to labels, side by side in one run (issue 42): MobileNetV2 (ImageNet
weights, fp32 ONNX, batch 1) served three ways, on the same photos, interleaved in rounds.

1. ``agent /predict``: a real ``edge-agent run`` answers the JPEG bytes through the bundle's
   signed pipeline (decode, resize 256x256, centre crop 224, mean/std, model, softmax top-5);
   and the same agent's second bundle whose pipeline folds the mean/std into the ONNX graph
   (``folded: [normalize]``, converters/graph_fold.py): the agent skips that numpy step.
2. ``agent /infer``: the same agent, the model alone: the already pre-processed tensor, raw.
3. ``python loop``: the same pipeline written the usual way in-process (Pillow decode and
   resize, numpy normalize, onnxruntime with its defaults, numpy softmax top-5); and the same
   loop with the agent's onnxruntime settings (intra-op threads not spinning between runs),
   so that the session's settings are not mistaken for the pipeline's cost.
4. ``decode + pre only``: ``edgesdk.pipeline.preprocess`` against the usual code's own
   decode/resize/crop/normalize, in-process, to tell the steps' cost from the HTTP's.

5. ``python loop behind raw HTTP``: the fair peer of ``/predict``: the same usual loop (with
   the agent's onnxruntime settings) answering JPEG bodies with JSON labels (orjson) from the
   raw uvloop + httptools server of benchmarks/_fair_peers.py (the API benchmarks' fastest
   peer), in its own process, over the same kind of keep-alive connection as the agent's.

6. The keyword spotter from WAV (``--cells wav`` alone, or beside the JPEG cells): pymicro-wakeword's
   okay_nabu streaming int8 ``.tflite`` shipped ``--as-is`` with the pipeline of
   examples/embedded_developer/keyword_spotter.yaml (WAV → micro_frontend → the model over its
   3-frame chunks from its initial state → detection); against the usual host code, a fresh
   pymicro-wakeword detector per WAV (its C frontend and its own TFLite C library), in-process
   and behind the same raw HTTP server; and the features alone: ``edgesdk.pipeline.preprocess``
   (pymicro-features' C frontend where installed, as here, else its numpy twin) vs
   pymicro-features as pymicro-wakeword calls it. Needs ai-edge-litert and pymicro-wakeword (the dev extra).

Cells take turns request by request, in a new random order each round (seeded), so the load of a
shared machine hits each alike and no cell always runs right after the same one (a rotation kept
their cyclic order: plain /predict always followed onnxruntime's default session, whose intra-op
threads spin after each run, and paid for it: BENCHMARKS.md).

The bundle is made by ``edgesdk convert --pipeline --validation-images --reference`` with the
python loop's own function as the reference, so the run also shows the end-to-end gate on a
real model. Memory per request: the agent's decoded-image charge (what /predict reserves
before decoding) and its peak RSS growth over the /predict rounds; the loop's tracemalloc peak
of one request. Needs torch, scikit-image, the MobileNetV2 weights and Pillow.

Run: ``.venv/bin/python benchmarks/bench_pipeline.py [--requests 200] [--rounds 3] [--json]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

PIPELINE = """\
input: image
image:
  color: RGB
  resize: {height: 256, width: 256, interpolation: bilinear}
  center_crop: {height: 224, width: 224}
  scale: 0.00392156862745098
  mean: [0.485, 0.456, 0.406]
  std: [0.229, 0.224, 0.225]
post:
  activation: softmax
  top_k: 5
"""

#: The usual loop, as a user writes it; also the ``--reference`` of the conversion.
USUAL_LOOP = '''\
"""MobileNetV2 the usual way: Pillow + numpy + onnxruntime, in-process."""
import os

import numpy as np
import onnxruntime as ort
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
LABELS = open(os.environ["BENCH_LABELS"]).read().splitlines()
_options = ort.SessionOptions()
_options.intra_op_num_threads = int(os.environ.get("BENCH_THREADS", "0"))
SESSION = ort.InferenceSession(os.environ["BENCH_ONNX"], _options, providers=["CPUExecutionProvider"])


def pre(data: bytes):
    image = Image.open(__import__("io").BytesIO(data)).convert("RGB").resize((256, 256), Image.Resampling.BILINEAR)
    image = image.crop((16, 16, 240, 240))
    x = ((np.asarray(image, np.float32) / 255.0 - MEAN) / STD).transpose(2, 0, 1)[None]
    return np.ascontiguousarray(x)


def predict(data: bytes):
    logits = SESSION.run(None, {"image": pre(data)})[0][0].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    best = np.argsort(-p)[:5]
    return [{"label": LABELS[i], "index": int(i), "score": float(p[i])} for i in best]
'''


#: The keyword spotter the usual way: a WAV read with the stdlib, pymicro-wakeword's own detector.
USUAL_WAV_LOOP = '''\
"""okay_nabu the usual way: wave + pymicro-wakeword (its C frontend and TFLite C library), in-process."""
import io
import wave

from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures, Model


def predict(data: bytes):
    with wave.open(io.BytesIO(data)) as source:
        pcm = source.readframes(source.getnframes())
    detector = MicroWakeWord.from_builtin(Model.OKAY_NABU)  # from its initial state, as each WAV is
    features = MicroWakeWordFeatures()
    scores = [detector.process_streaming_prob(f) for f in features.process_streaming(pcm)]
    best = max(p for p in scores if p is not None)
    return {"detected": best > detector.probability_cutoff, "probability": best}
'''
WAVS = [
    REPO_ROOT / "examples" / "embedded_developer" / "keyword_spotter_okay_nabu.wav",
    REPO_ROOT / "examples" / "embedded_developer" / "keyword_spotter_weather.wav",
]
JPEG_CELLS = [
    "agent /predict (JPEG)",
    "agent /predict, mean/std folded into the graph (JPEG)",
    "python loop behind raw HTTP, agent's ORT settings (JPEG)",
    "agent /infer (tensor)",
    "python loop (JPEG)",
    "python loop, agent's ORT settings",
    "decode + pre only: edgesdk.pipeline, in-process",
    "decode + pre only: the usual code, in-process",
]
WAV_CELLS = [
    "agent /predict (WAV, keyword spotter)",
    "python loop behind raw HTTP (WAV, pymicro-wakeword)",
    "python loop (WAV, pymicro-wakeword)",
    "WAV decode + features only: edgesdk.pipeline, in-process",
    "WAV decode + features only: pymicro-features, in-process",
]


def percentiles(times_ms: list[float]) -> dict[str, float]:
    values = np.asarray(times_ms)
    return {f"p{q}_ms": round(float(np.percentile(values, q)), 2) for q in (50, 95, 99)}


def prepare(work: Path) -> dict[str, Any]:
    """ONNX export, JPEGs, labels, the usual loop's file; the convert + package + install."""
    import torch

    from edgesdk.workloads import mobilenet

    net = mobilenet.pretrained_mobilenet_v2().eval()
    onnx_path = work / "mobilenet_v2.onnx"
    torch.onnx.export(
        net, torch.zeros(1, 3, 224, 224), str(onnx_path), input_names=["image"], output_names=["logits"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    from PIL import Image

    images = work / "images"
    images.mkdir()
    jpegs = []
    for name, pixels in mobilenet.sample_images():
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        (images / f"{name}.jpg").write_bytes(buffer.getvalue())
        jpegs.append(buffer.getvalue())
    (work / "labels.txt").write_text("\n".join(mobilenet.class_name(i) for i in range(1000)) + "\n")
    (work / "pipeline.yaml").write_text(PIPELINE)
    (work / "usual_loop.py").write_text(USUAL_LOOP)
    return {"onnx": onnx_path, "jpegs": jpegs, "images": images}


def convert_and_install(
    work: Path, setup: dict[str, Any], env: dict[str, str], device: Any, pipeline: str, name: str
) -> dict[str, Any]:
    """``pipeline`` (a file in ``work``) converted, gated end to end, packaged as ``name`` and installed."""
    from tests.agent_helpers import PROFILE, run_agent_cli

    validation = REPO_ROOT / ".pytest_cache" / "d" / "edgesdk-mobilenet-v2" / "validation.npz"
    data = ["--validation", str(validation)] if validation.exists() else ["--input", "image=1x3x224x224"]
    started = time.perf_counter()
    converted = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", str(setup["onnx"]), "--profile", PROFILE,
         "--formats", "onnx", "--precisions", "fp32", "--out", str(work / name), *data,
         "--pipeline", str(work / pipeline), "--labels", str(work / "labels.txt"),
         "--validation-images", str(setup["images"]), "--reference", f"{work / 'usual_loop.py'}:predict",
         "--task-gate", "0.9"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    if converted.returncode != 0:
        raise SystemExit(f"convert failed:\n{converted.stderr[-3000:]}")
    convert_s = time.perf_counter() - started
    report = json.loads((work / name / "report.json").read_text())
    bundle = work / f"{name}.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(work / name), "--name", name,
         "--version", "1.0.0", "--release", "1", "--publisher-key", str(device.publisher_key),
         "--recipient", str(device.device_pub), "--target", PROFILE, "--out", str(bundle),
         "--pipeline", str(work / pipeline), "--labels", str(work / "labels.txt")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    if packaged.returncode != 0:
        raise SystemExit(f"package failed:\n{packaged.stderr[-3000:]}")
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    if installed.returncode != 0:
        raise SystemExit(f"install failed:\n{installed.stderr[-3000:]}")
    task = report["variants"][0]["task_accuracy"]
    return {f"{name} convert_s": round(convert_s, 1), f"{name} end_to_end_gate": task["note"]}


def serve_usual_loop(port: int) -> None:
    """The fair peer: the usual loop behind _fair_peers.py's raw uvloop + httptools server
    (``--serve-loop PORT``; BENCH_* in the environment), with the agent's session settings."""
    import importlib

    import onnxruntime as ort
    import orjson
    import uvloop

    usual_loop: Any = importlib.import_module("usual_loop") if "BENCH_ONNX" in os.environ else None  # JPEG loop

    from benchmarks._fair_peers import RawProtocol, serve_raw

    quiet = ort.SessionOptions()
    quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the agent's sessions
    if "BENCH_ONNX" in os.environ:
        usual_loop.SESSION = ort.InferenceSession(os.environ["BENCH_ONNX"], quiet, providers=["CPUExecutionProvider"])

    def work(content_type: str, body: bytes, x_tensors: str) -> tuple[bytes, str, list[tuple[str, str]]]:
        if content_type == "audio/wav":
            import usual_wav_loop  # type: ignore[import-not-found]

            return orjson.dumps(usual_wav_loop.predict(body)), "application/json", []
        return orjson.dumps({"labels": usual_loop.predict(body)}), "application/json", []

    RawProtocol.work = staticmethod(work)  # type: ignore[assignment]
    uvloop.run(serve_raw(port))


def start_loop_server(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**env, "PYTHONPATH": os.pathsep.join([str(work), str(REPO_ROOT)])}
    server = subprocess.Popen([sys.executable, __file__, "--serve-loop", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):  # listening: it answers only JPEG bodies, so a connection is the probe
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, url
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the usual loop's raw HTTP server did not start")


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(
    requests: int, rounds: int, folded_first: bool = False, kinds: tuple[str, ...] = ("jpeg", "wav")
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        return measure(work, requests, rounds, folded_first, kinds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install_spotter(work: Path, device: Any) -> dict[str, Any]:
    """okay_nabu from the pymicro-wakeword wheel, converted ``--as-is`` and packaged with the
    keyword spotter's pipeline, installed on ``device``."""
    from edgesdk.toolchain import convert, package
    from edgesdk.workloads.wakeword import wakeword_tflite
    from tests.agent_helpers import PROFILE, run_agent_cli

    model = wakeword_tflite(work / "wakeword")
    frames = np.random.default_rng(0).integers(-128, -90, (8, 3, 40)).astype(np.int8)
    started = time.perf_counter()
    report = convert(model, PROFILE, out=work / "okay_nabu", validation={"input_audio": frames}, as_is=True)
    pipeline = REPO_ROOT / "examples" / "embedded_developer" / "keyword_spotter.yaml"
    bundle = package(
        report, out=work / "okay_nabu.edgepkg", name="okay_nabu", version="1.0.0", release=1,
        publisher_key=device.publisher_key, recipients=device.device_pub, targets=[PROFILE], pipeline=pipeline,
    )  # fmt: skip
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    if installed.returncode != 0:
        raise SystemExit(f"install failed:\n{installed.stderr[-3000:]}")
    (work / "usual_wav_loop.py").write_text(USUAL_WAV_LOOP)
    return {"okay_nabu convert --as-is + package s": round(time.perf_counter() - started, 1)}


def measure(
    work: Path, requests: int, rounds: int, folded_first: bool = False, kinds: tuple[str, ...] = ("jpeg", "wav")
) -> dict[str, Any]:
    import httpx

    from edgesdk.pipeline.audio import decoded_nbytes as audio_nbytes
    from edgesdk.pipeline.audio import open_audio
    from edgesdk.pipeline.image import decoded_nbytes, open_image
    from tests.agent_helpers import AgentProcess, agent_env, make_device

    load_before = os.getloadavg()[0]
    threads = os.cpu_count() or 1
    env = agent_env()
    device = make_device(work / "device")
    converted: dict[str, Any] = {}
    cells: list[str] = []
    sys.path.insert(0, str(work))
    if "jpeg" in kinds:
        setup = prepare(work)
        env |= {"BENCH_ONNX": str(setup["onnx"]), "BENCH_LABELS": str(work / "labels.txt")}
        env["BENCH_THREADS"] = "0"  # onnxruntime's default, as the agent's (runtime_threads unset)
        (work / "folded.yaml").write_text(PIPELINE + "folded: [normalize]\n")
        bundles = [("pipeline.yaml", "mobilenet"), ("folded.yaml", "mobilenet-folded")]
        converted["installed first"] = "folded" if folded_first else "plain"
        for pipeline_file, name in reversed(bundles) if folded_first else bundles:  # the order shows (BENCHMARKS.md)
            converted |= convert_and_install(work, setup, env, device, pipeline_file, name)
        os.environ.update({k: env[k] for k in ("BENCH_ONNX", "BENCH_LABELS", "BENCH_THREADS")})
        cells += JPEG_CELLS
    if "wav" in kinds:
        converted |= install_spotter(work, device)
        cells += WAV_CELLS
    times: dict[str, list[float]] = {name: [] for name in cells}
    jpeg = _JpegCells(work, setup) if "jpeg" in kinds else None
    wav = _WavCells() if "wav" in kinds else None
    loop_server, loop_url = start_loop_server(work, env)
    with (
        AgentProcess(device) as agent,
        httpx.Client(base_url=agent.url, timeout=60) as client,
        httpx.Client(base_url=loop_url, timeout=60) as peer,
    ):
        agreement = {**(jpeg.warm_up(client, peer) if jpeg else {}), **(wav.warm_up(client, peer) if wav else {})}
        before = vm_hwm_mb(agent.proc.pid)  # type: ignore[union-attr]
        order = np.random.default_rng(0)
        for n in range(requests * rounds):
            for name in order.permutation(cells).tolist():  # no cell always pays for the same one before it
                started = time.perf_counter()
                cell = wav if name in WAV_CELLS else jpeg
                assert cell is not None
                reply = cell.run(name, n, client, peer)
                times[name].append((time.perf_counter() - started) * 1000)
                if reply is not None and reply.status_code != 200:
                    raise SystemExit(f"{name}: {reply.status_code} {reply.text[:300]}")
        agent_peak_growth = vm_hwm_mb(agent.proc.pid) - before  # type: ignore[union-attr]
        agent_peak = vm_hwm_mb(agent.proc.pid)  # type: ignore[union-attr]
    loop_server.terminate()
    loop_server.wait(timeout=10)
    memory = {
        "agent peak RSS growth over the timed rounds, MB": round(agent_peak_growth, 1),
        "agent peak RSS (whole process, models loaded), MB": round(agent_peak, 1),
    }
    if jpeg:
        memory |= jpeg.memory(decoded_nbytes, open_image)
    if wav:
        memory |= wav.memory(audio_nbytes, open_audio)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.uname().machine}, {threads} cores (shared with other jobs)",
        "load_average_1min_before_and_after": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
        "requests_per_cell": requests * rounds,
        **converted,
        **agreement,
        "latency": {name: percentiles(values) for name, values in times.items()},
        "p50 ratios (below 1: the agent is faster)": ratios(times),
        "memory": memory,
    }


class _JpegCells:
    """MobileNetV2 from JPEG: the agent's two bundles, the usual loop in-process and behind HTTP."""

    def __init__(self, work: Path, setup: dict[str, Any]) -> None:
        import onnxruntime as ort
        import usual_loop  # type: ignore[import-not-found]

        from edgesdk.pipeline import preprocess
        from edgesdk.schemas.manifest import TensorSpec
        from edgesdk.schemas.pipeline import load_pipeline

        self.loop = usual_loop
        self.jpegs: list[bytes] = setup["jpegs"]
        self.pipeline = load_pipeline(work / "pipeline.yaml", work / "labels.txt")
        self.spec = [TensorSpec(name="image", dtype="float32", shape=[1, 3, 224, 224])]
        self.tensors = [preprocess(self.pipeline, j, "image/jpeg", self.spec)["image"] for j in self.jpegs]
        self.default_session = usual_loop.SESSION
        quiet = ort.SessionOptions()
        quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the agent's sessions
        self.quiet_session = ort.InferenceSession(str(setup["onnx"]), quiet, providers=["CPUExecutionProvider"])
        self.raw = {"Content-Type": "application/x-edgesdk-tensors", "X-Tensors": "image=float32[1,3,224,224]"}

    def _predict(self, client: Any, i: int, model: str = "mobilenet") -> Any:
        return client.post(f"/v1/models/{model}/predict", content=self.jpegs[i], headers={"Content-Type": "image/jpeg"})

    def warm_up(self, client: Any, peer: Any) -> dict[str, str]:
        """One request of each photo through each path, and the top-1 labels side by side."""
        same_label = same_folded = same_peer = 0
        for i, jpeg in enumerate(self.jpegs):
            reply = self._predict(client, i)
            if reply.status_code != 200:
                raise SystemExit(f"/predict answered {reply.status_code}: {reply.text[:300]}")
            usual = self.loop.predict(jpeg)[0]["label"]
            same_label += reply.json()["labels"][0]["label"] == usual
            same_folded += self._predict(client, i, "mobilenet-folded").json()["labels"][0]["label"] == usual
            answer = peer.post("/predict", content=jpeg, headers={"Content-Type": "image/jpeg"})
            same_peer += answer.json()["labels"][0]["label"] == usual
            client.post("/v1/models/mobilenet/infer", content=self.tensors[i].tobytes(), headers=self.raw)
        total = len(self.jpegs)
        return {
            "photos": str(total),
            "same_top1_label_agent_vs_loop": f"{same_label}/{total}",
            "same_top1_label_agent_folded_vs_loop": f"{same_folded}/{total}",
            "same_top1_label_http_peer_vs_loop": f"{same_peer}/{total}",
        }

    def run(self, name: str, n: int, client: Any, peer: Any) -> Any:
        from edgesdk.pipeline import preprocess

        i = n % len(self.jpegs)
        if name.startswith("agent /predict, mean/std folded"):
            return self._predict(client, i, "mobilenet-folded")
        if name.startswith("agent /predict"):
            return self._predict(client, i)
        if name.startswith("python loop behind raw HTTP"):
            return peer.post("/predict", content=self.jpegs[i], headers={"Content-Type": "image/jpeg"})
        if name.startswith("agent /infer"):
            return client.post("/v1/models/mobilenet/infer", content=self.tensors[i].tobytes(), headers=self.raw)
        if name.startswith("decode + pre only: edgesdk"):
            preprocess(self.pipeline, self.jpegs[i], "image/jpeg", self.spec)
        elif name.startswith("decode + pre only"):
            self.loop.pre(self.jpegs[i])
        else:
            self.loop.SESSION = self.default_session if name == "python loop (JPEG)" else self.quiet_session
            self.loop.predict(self.jpegs[i])
        return None

    def memory(self, decoded_nbytes: Any, open_image: Any) -> dict[str, float]:
        self.loop.SESSION = self.default_session
        charges = [
            decoded_nbytes(open_image(j, "image/jpeg", self.pipeline.image.max_pixels), self.pipeline.image)
            for j in self.jpegs
        ]
        return {
            "agent decoded-image charge per request, MB (median)": round(float(np.median(charges)) / 2**20, 2),
            "python loop tracemalloc peak of one request, MB": _traced_peak(self.loop.predict, self.jpegs[0]),
        }


class _WavCells:
    """The keyword spotter from WAV: the agent's /predict, pymicro-wakeword in-process and behind HTTP."""

    def __init__(self) -> None:
        import usual_wav_loop  # type: ignore[import-not-found]

        from edgesdk.schemas.pipeline import load_pipeline

        self.loop = usual_wav_loop
        self.wavs = [path.read_bytes() for path in WAVS]
        self.pipeline = load_pipeline(REPO_ROOT / "examples" / "embedded_developer" / "keyword_spotter.yaml")

    def _predict(self, client: Any, i: int) -> Any:
        return client.post("/v1/models/okay_nabu/predict", content=self.wavs[i], headers={"Content-Type": "audio/wav"})

    def warm_up(self, client: Any, peer: Any) -> dict[str, str]:
        """Each WAV through each path: the agent's answers beside pymicro-wakeword's."""
        same, worst = 0, 0.0
        for i, wav in enumerate(self.wavs):
            answer, usual = self._predict(client, i).json(), self.loop.predict(wav)
            peer.post("/predict", content=wav, headers={"Content-Type": "audio/wav"})
            same += answer["detected"] == usual["detected"]
            worst = max(worst, abs(answer["probability"] - usual["probability"]))
        return {
            "wavs": f"{len(self.wavs)} ({', '.join(p.name for p in WAVS)})",
            "same_detection_agent_vs_pymicro_wakeword": f"{same}/{len(self.wavs)}",
            "largest probability difference agent vs pymicro_wakeword": f"{worst:.2g}",
        }

    def run(self, name: str, n: int, client: Any, peer: Any) -> Any:
        from edgesdk.pipeline import preprocess

        i = n % len(self.wavs)
        if name.startswith("agent /predict"):
            return self._predict(client, i)
        if name.startswith("python loop behind raw HTTP"):
            return peer.post("/predict", content=self.wavs[i], headers={"Content-Type": "audio/wav"})
        if name.startswith("python loop"):
            self.loop.predict(self.wavs[i])
        elif name.startswith("WAV decode + features only: edgesdk"):
            preprocess(self.pipeline, self.wavs[i], "audio/wav", [_Input()])
        else:
            _usual_features(self.wavs[i])
        return None

    def memory(self, decoded_nbytes: Any, open_audio: Any) -> dict[str, float]:
        charges = [
            decoded_nbytes(open_audio(w, "audio/wav", self.pipeline.audio), self.pipeline.audio) for w in self.wavs
        ]
        return {
            "agent decoded-audio charge per WAV request, MB (median)": round(float(np.median(charges)) / 2**20, 2),
            "pymicro-wakeword loop tracemalloc peak of one WAV request, MB": _traced_peak(
                self.loop.predict, self.wavs[0]
            ),
        }


class _Input:
    """okay_nabu's input as the agent's public signature has it (float; quantized by the agent)."""

    name, dtype, shape = "input_audio", "float32", [1, 3, 40]


def _usual_features(wav: bytes) -> list[Any]:
    import wave

    from pymicro_wakeword import MicroWakeWordFeatures

    with wave.open(io.BytesIO(wav)) as source:
        return list(MicroWakeWordFeatures().process_streaming(source.readframes(source.getnframes())))


def _traced_peak(function: Any, argument: Any) -> float:
    tracemalloc.start()
    function(argument)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return round(peak, 2)


def ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """The agent's /predict (plain and folded) over the fair HTTP peer, and folded over plain."""
    p50 = {name: float(np.percentile(values, 50)) for name, values in times.items()}
    out: dict[str, float] = {}
    if JPEG_CELLS[0] in p50:
        plain, folded = p50["agent /predict (JPEG)"], p50["agent /predict, mean/std folded into the graph (JPEG)"]
        peer = p50["python loop behind raw HTTP, agent's ORT settings (JPEG)"]
        out |= {
            "agent /predict / loop behind raw HTTP": round(plain / peer, 3),
            "agent /predict folded / loop behind raw HTTP": round(folded / peer, 3),
            "agent /predict folded / agent /predict": round(folded / plain, 3),
        }
    if WAV_CELLS[0] in p50:
        out["agent /predict (WAV) / pymicro-wakeword behind raw HTTP"] = round(p50[WAV_CELLS[0]] / p50[WAV_CELLS[1]], 3)
        out["WAV features: edgesdk.pipeline / pymicro-features"] = round(p50[WAV_CELLS[3]] / p50[WAV_CELLS[4]], 3)
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-loop":
        serve_usual_loop(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per cell per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--folded-first", action="store_true", help="install the folded bundle before the plain one")
    parser.add_argument(
        "--cells",
        choices=["all", "jpeg", "wav"],
        default="all",
        help="MobileNetV2 from JPEG, the keyword spotter from WAV, or both interleaved",
    )
    args = parser.parse_args()
    kinds = ("jpeg", "wav") if args.cells == "all" else (args.cells,)
    result = run(args.requests, args.rounds, args.folded_first, kinds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for name, figure in value.items():
                print(f"  {name}: {figure}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
