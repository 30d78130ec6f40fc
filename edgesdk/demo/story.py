"""The demo's story, step by step, with real parts only.

Developer: train the digits CNN, convert it for the profile with a precision ladder (the real
converter, validated in the device runtime), build a deliberately slow v3, make keys.
Fleet: start mosquitto, the fleet service (``edgesdk fleet serve``: SQLite in the work dir,
REST API and dashboard on a loopback port) and N ``edge-agent run`` processes (own key pairs,
MQTT link, a scripted sensor trace each), enroll them from their announced keys, package
v1/v2/v3 encrypted to the approved keys and signed. Every rollout is handed to the service over
its REST API (upload the bundle, create the deployment) and the demo only reads its state:
deliver v1 over the air, send traffic through each local API, install a second model beside it
on every device (pymicro-wakeword's real ``okay_nabu.tflite`` keyword spotter, shipped as it is
and served by LiteRT) and send it traffic too, watch one device step its precision down and back
up through a heat wave, push v2 as a canary rollout, then push v3 whose canary breaks the
latency SLO in probation and is rolled back automatically by the service (the rollout aborts
before the other devices get it). The second model keeps answering through every update of the
first: its failed requests are part of the summary.

Everything the steps start is stopped in ``finally`` — normal end, error or Ctrl-C.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.demo.collector import Collector, Sample
from edgesdk.demo.digit_files import digit_pngs, digits_png_pipeline
from edgesdk.demo.processes import ProcessSet
from edgesdk.demo.traces import WAVE_S, write_heat_trace, write_idle_trace
from edgesdk.demo.traffic import TrafficGenerator
from edgesdk.errors import EdgeSDKError, FleetServiceError
from edgesdk.schemas.profile import DeviceProfile

log = logging.getLogger("edgesdk.demo")

Say = Callable[[str], None]

GROUP = "demo"
NAMESPACE = "edgesdk"
#: The probation SLO of the rollouts: the digits CNN answers in well under a millisecond,
#: the slow v3 in tens of milliseconds.
P95_SLO_MS = 10.0


class DemoError(EdgeSDKError):
    """A demo step could not finish (the message says which and why). ``log_file`` is the log
    of the process that failed, when one did: ``edgesdk demo`` prints its last lines."""

    def __init__(self, message: str, *, log_file: Path | None = None) -> None:
        super().__init__(message)
        self.log_file = log_file


@dataclass
class DemoOptions:
    profile: DeviceProfile
    workdir: Path
    reports_dir: Path
    agents: int = 3
    formats: tuple[str, ...] = ("onnx",)
    probation_s: float = 6.0
    heat_timeout_s: float = 90.0
    profiles_dirs: tuple[str, ...] = ()
    model_cache: Path | None = None  # reuse the trained digits model from here (trained there if missing)
    broker: str = "auto"  # auto: mosquitto when installed, else the embedded amqtt broker; or one of them


@dataclass
class DemoResult:
    """What the summary and the fleet report are made of."""

    profile: str
    workdir: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    conversion: dict[str, Any] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    heat: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, str] = field(default_factory=dict)
    service: dict[str, str] = field(default_factory=dict)  # dashboard URL, token file, database
    #: The model served beside digits: its name, variant, rollout; or ``skipped`` with the reason.
    second_model: dict[str, Any] = field(default_factory=dict)
    #: What the digits traffic sends: "PNG files to /predict" or "tensors to /infer".
    digits_traffic: str = ""
    wall_s: float = 0.0


def agent_command() -> list[str]:
    """``edge-agent`` from this environment (next to this Python), else ``python -m``."""
    script = Path(sys.executable).with_name("edge-agent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "edgesdk.agent.cli"]


class Demo:
    """One run of the story; ``run()`` returns the result, always cleaning up."""

    def __init__(self, options: DemoOptions, say: Say) -> None:
        self.options = options
        self.say = say
        self.work = options.workdir
        self.started = time.monotonic()
        self.result = DemoResult(profile=options.profile.name, workdir=str(self.work))
        self.processes = ProcessSet()
        self.broker: Any = None
        self.broker_url = ""
        self.mqtt_protocol = "auto"
        self.service: Any = None  # edgesdk.demo.fleet_service.DemoService once it answers
        self.collector: Collector | None = None
        # The digits bundles' signed pipeline, built once: None where Pillow is missing (then the
        # traffic is tensors to /infer instead of PNG files to /predict).
        self.png_pipeline = digits_png_pipeline()
        self.traffic: TrafficGenerator | None = None
        self.second_traffic: TrafficGenerator | None = None  # to the second model
        self.agent_urls: dict[str, str] = {}
        self.hot_device = ""
        self._timeline_lock = threading.Lock()

    # -- helpers ------------------------------------------------------------------------------

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def _step(self, name: str, began: float, detail: str) -> None:
        took = time.monotonic() - began
        self.result.steps.append({"step": name, "seconds": round(took, 1), "detail": detail})
        self.say(f"[green]✓[/green] {name} [dim]({took:.1f} s)[/dim] — {detail}")

    def _mark(self, deployment: str, event: str, **info: Any) -> None:
        with self._timeline_lock:
            self.result.timeline.append({"t": self._now(), "deployment": deployment, "event": event, **info})

    # -- the story ----------------------------------------------------------------------------

    def run(self) -> DemoResult:
        try:
            digits, convert_v1, convert_v3 = self.build_models()
            keys = self.make_keys()
            self.start_broker()
            service_started = self.start_service(keys)
            self.start_agents(keys)
            self.wait_service(service_started)
            registry = self.enroll()
            bundles = self.package(convert_v1, convert_v3, keys, registry)
            self.push("v1", bundles["v1"], canary=0.0, expect="SUCCEEDED")
            self.serve(digits)
            self.add_second_model(keys, registry)
            self.heat_wave()
            self.push("v2", bundles["v2"], canary=1.0 / self.options.agents, expect="SUCCEEDED")
            self.push("v3", bundles["v3"], canary=1.0 / self.options.agents, expect="ABORTED")
            time.sleep(2.0)  # a little traffic on v2 after the rollback, for the plots
            self.finish(convert_v1)
            return self.result
        except DemoError as exc:
            if exc.log_file is None and (culprit := self._exited_child_log()) is not None:
                exc.log_file = culprit
            raise
        except EdgeSDKError as exc:
            # An error of a part (the service's REST API, the converter): a child that died is
            # the likely reason, so its log goes with the error.
            raise DemoError(str(exc), log_file=self._exited_child_log()) from exc
        finally:
            self.cleanup()

    def _exited_child_log(self) -> Path | None:
        """The log of the first child (broker, service, agent) that has exited, if any."""
        for name in self.processes.exited():
            return self.processes.log_file(name)
        return None

    def build_models(self) -> tuple[Any, Path, Path]:
        from edgesdk.converters.pipeline import convert
        from edgesdk.demo.models import export_slow_digits
        from edgesdk.workloads.digits import prepare_digits

        began = time.monotonic()
        self.say("training the digits CNN (scikit-learn's 8x8 digits) and exporting ONNX…")
        digits = prepare_digits(self.options.model_cache or self.work / "model")
        self._step("train + export", began, f"test accuracy {digits.test_accuracy:.1%}")

        began = time.monotonic()
        profile = self.options.profile
        self.say(f"converting for {profile.display_name} ({', '.join(self.options.formats)}; fp32 → fp16 → int8)…")
        report = convert(
            digits.onnx,
            profile,
            self.work / "convert-v1",
            calibration=digits.calibration,
            validation=digits.validation,
            formats=list(self.options.formats),
            name="digits",
            # (message, steps done, steps in all); *rest keeps older one-argument converters working
            progress=lambda message, *rest: self.say(f"  convert: {message} {_steps(rest)}"),
        )
        shipped = [f"{v.id} {v.precision.value}" for v in report.variants]
        if not report.variants:
            raise DemoError(f"the converter shipped no variant for {profile.name}; see {self.work / 'convert-v1'}")
        self.result.conversion = {
            "profile": profile.name,
            "report_html": str(self.work / "convert-v1" / "report.html"),
            "variants": [
                {"id": v.id, "precision": v.precision.value, "runtime": str(v.runtime.value), "size": v.size}
                for v in report.variants
            ],
            "rejected": [r.id for r in report.rejected],
        }
        self._step("convert v1", began, ", ".join(shipped))

        began = time.monotonic()
        self.say("building v3: the same network with a costly side branch (accurate, but slow)…")
        (self.work / "model").mkdir(parents=True, exist_ok=True)
        slow_onnx = export_slow_digits(digits, self.work / "model" / "digits_slow.onnx")
        report_v3 = convert(
            slow_onnx,
            profile,
            self.work / "convert-v3",
            # 64 test images are plenty to show v3 is accurate; all 449 through the slow branch cost ~15 s.
            validation={k: v[:64] for k, v in np.load(digits.validation).items()},
            formats=["onnx"],
            precisions=["fp32"],
            name="digits",
        )
        self._step("convert v3 (slow)", began, ", ".join(v.id for v in report_v3.variants))
        return digits, self.work / "convert-v1", self.work / "convert-v3"

    def make_keys(self) -> dict[str, Path]:
        from edgesdk.keys import generate_publisher_key

        began = time.monotonic()
        publisher_key, publisher_pub = generate_publisher_key(self.work / "keys" / "publisher")
        operator_key, operator_pub = generate_publisher_key(self.work / "keys" / "operator")
        self._step("keys", began, "publisher (signs bundles) and operator (signs deployments), Ed25519")
        return {
            "publisher_key": publisher_key,
            "publisher_pub": publisher_pub,
            "operator_key": operator_key,
            "operator_pub": operator_pub,
        }

    def start_broker(self) -> None:
        from edgesdk.demo.embedded_broker import amqtt_available
        from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto

        began = time.monotonic()
        choice = self.options.broker
        use_mosquitto = choice == "mosquitto" or (choice == "auto" and find_mosquitto() is not None)
        if use_mosquitto:
            if find_mosquitto() is None:
                raise DemoError("--broker mosquitto but mosquitto is not installed: sudo apt-get install -y mosquitto")
            self.broker = MosquittoBroker(data_dir=self.work / "broker").start()
            self.broker_url = self.broker.url
            self._step("broker", began, f"mosquitto on {self.broker_url}")
            return
        if not amqtt_available():
            raise DemoError(
                "the demo needs an MQTT broker: install mosquitto (sudo apt-get install -y mosquitto) "
                "or the embedded one (pip install 'edgesdk[demo]')"
            )
        port = _free_port()
        (self.work / "broker").mkdir(parents=True, exist_ok=True)
        self.processes.start(
            "broker",
            [sys.executable, "-m", "edgesdk.demo.embedded_broker", "--port", str(port)],
            log_file=self.work / "broker" / "amqtt.log",
        )
        deadline = time.monotonic() + 30
        while not _port_open(port):
            if "broker" in self.processes.exited() or time.monotonic() > deadline:
                amqtt_log = self.work / "broker" / "amqtt.log"
                raise DemoError(f"the embedded broker did not start; see {amqtt_log}", log_file=amqtt_log)
            time.sleep(0.1)
        self.broker_url = f"mqtt://127.0.0.1:{port}"
        self.mqtt_protocol = "3.1.1"  # amqtt speaks MQTT 3.1.1 only
        self._step("broker", began, f"embedded amqtt broker (MQTT 3.1.1) on {self.broker_url}")

    def start_agents(self, keys: dict[str, Path]) -> None:
        from edgesdk.image.toml_writer import dumps

        began = time.monotonic()
        profile = self.options.profile
        devices = [f"edge-{i}" for i in range(1, self.options.agents + 1)]
        self.hot_device = devices[0]
        port_files: dict[str, Path] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_AGENT")}
        for index, device in enumerate(devices):
            root = self.work / "devices" / device
            data_dir = root / "data"
            data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if device == self.hot_device:
                trace = write_heat_trace(root / "sensors.jsonl", profile.thermal)
            else:
                trace = write_idle_trace(root / "sensors.jsonl", profile.thermal, seed=index)
            config = {
                "device_id": device,
                "profile": profile.name,
                "data_dir": str(data_dir),
                "publisher_keys": [str(keys["publisher_pub"]), str(keys["operator_pub"])],
                "log_format": "text",
                "runtime_threads": 1,
                "api": {"host": "127.0.0.1", "port": 0},
                "mqtt": {
                    "enabled": True,
                    "broker": self.broker_url,
                    "protocol": self.mqtt_protocol,
                    "namespace": NAMESPACE,
                    "groups": [GROUP],
                    "telemetry_interval_s": 2.0,
                },
                "governor": {
                    "source": "trace",
                    "trace_file": str(trace),
                    "poll_interval_s": 0.5,
                    "min_dwell_s": 2.0,  # the profile's dwell is for real heat; the demo is short
                },
            }
            (root / "agent.toml").write_text(dumps(config, header=f"edgesdk demo: {device}"))
            port_files[device] = data_dir / "api.port"
            self.processes.start(
                device,
                [*agent_command(), "run", "--config", str(root / "agent.toml")],
                log_file=root / "agent.log",
                env=env,
            )
        self.say(f"starting {len(devices)} edge-agent processes…")
        deadline = time.monotonic() + 90
        while len(self.agent_urls) < len(devices):
            exited = self.processes.exited()
            if exited:
                name, code = next(iter(exited.items()))
                log = self.processes.log_file(name)
                what = f"agent {name}" if name in port_files else f"the {name.replace('-', ' ')}"
                raise DemoError(f"{what} exited with status {code}; see {log}", log_file=log)
            for device, port_file in port_files.items():
                text = port_file.read_text().strip() if port_file.exists() else ""
                if text and device not in self.agent_urls:
                    self.agent_urls[device] = f"http://127.0.0.1:{int(text)}"
            if time.monotonic() > deadline:
                missing = sorted(set(devices) - set(self.agent_urls))
                raise DemoError(f"agents {', '.join(missing)} did not open their local API within 90 s")
            time.sleep(0.1)
        self.collector = Collector(self.agent_urls, started=self.started).start()
        pids = self.processes.pids()
        self._step(
            "agents",
            began,
            ", ".join(f"{d} (pid {pids[d]}, {u.rsplit(':', 1)[1]})" for d, u in self.agent_urls.items()),
        )

    def enroll(self) -> Path:
        from edgesdk.fleet.enrollment import RegistryFile, decode_public_key, discover_candidates

        began = time.monotonic()
        self.say("waiting for the devices' enroll requests (each made its own X25519 key on first start)…")
        wanted = set(self.agent_urls)
        deadline = time.monotonic() + 60
        candidates: dict[str, Any] = {}
        while not wanted <= set(candidates):
            if time.monotonic() > deadline:
                missing = sorted(wanted - set(candidates))
                raise DemoError(f"no enroll request from {', '.join(missing)} within 60 s")
            candidates = discover_candidates(self._client_options("enroll"), namespace=NAMESPACE, wait_s=1.0)
        registry_path = self.work / "fleet" / "enrollment.json"
        registry = RegistryFile(registry_path)
        for device in sorted(wanted):
            candidate = candidates[device]
            registry.approve(
                device,
                decode_public_key(candidate.public_key),
                profile=candidate.profile,
                expect_key_id=candidate.key_id,
            )
        self._step("enroll", began, ", ".join(f"{d} key {candidates[d].key_id[:12]}… approved" for d in sorted(wanted)))
        return registry_path

    def package(self, convert_v1: Path, convert_v3: Path, keys: dict[str, Path], registry: Path) -> dict[str, Path]:
        from edgesdk.bundle import package_bundle
        from edgesdk.fleet.enrollment import recipients_from_registry

        began = time.monotonic()
        recipients = recipients_from_registry(registry)
        out = self.work / "bundles"
        out.mkdir(parents=True, exist_ok=True)
        plan = {"v1": (convert_v1, "1.0.0", 1), "v2": (convert_v1, "1.1.0", 2), "v3": (convert_v3, "1.2.0", 3)}
        pipeline = self.png_pipeline
        bundles = {
            name: package_bundle(
                source,
                name="digits",
                version=version,
                release=release,
                publisher_key=keys["publisher_key"],
                recipients=recipients,
                out=out / f"digits-{version}.edgepkg",
                pipeline=pipeline,
            )
            for name, (source, version, release) in plan.items()
        }
        sizes = ", ".join(f"{n} {p.stat().st_size / 1024:.0f} KiB" for n, p in bundles.items())
        predict = "; /predict answers PNG files with labels" if pipeline is not None else ""
        self._step("package", began, f"signed, encrypted to {len(recipients)} approved keys: {sizes}{predict}")
        return bundles

    def _client_options(self, role: str) -> Any:
        from edgesdk.mqtt.client import ClientOptions

        return ClientOptions(
            client_id=f"edgesdk-demo-{role}-{os.getpid()}",
            broker_url=self.broker_url,
            clean_start=True,
            session_expiry_s=0,
            protocol=self.mqtt_protocol,  # type: ignore[arg-type]
        )

    def start_service(self, keys: dict[str, Path]) -> tuple[float, str, Path, Path]:
        """Start ``edgesdk fleet serve`` (it boots while the agents do; see wait_service)."""
        from edgesdk.demo.fleet_service import start_service

        began = time.monotonic()
        db_url, token_file, log_file = start_service(
            self.processes,
            self.work / "fleet",
            broker_url=self.broker_url,
            operator_key=keys["operator_key"],
            namespace=NAMESPACE,
        )
        return began, db_url, token_file, log_file

    def wait_service(self, started: tuple[float, str, Path, Path]) -> None:
        from edgesdk.demo.fleet_service import wait_devices_known, wait_service

        began, db_url, token_file, log_file = started
        try:
            self.service = wait_service(self.processes, db_url, token_file, log_file)
            wait_devices_known(self.service, GROUP, set(self.agent_urls))
        except FleetServiceError as exc:
            raise DemoError(str(exc), log_file=log_file) from exc
        self.result.service = {
            "dashboard": self.service.url,
            "token_file": str(token_file),
            "database": db_url,
            "log": str(log_file),
        }
        self._step(
            "fleet service",
            began,
            f"dashboard {self.service.url} (pid {self.processes.pids()['fleet-service']}, "
            f"operator token in {token_file}); it sees {len(self.agent_urls)} devices",
        )

    def push(self, name: str, bundle: Path, *, canary: float, expect: str) -> None:
        """Hand the rollout to the fleet service (REST API) and follow it until it ends."""
        from edgesdk.demo.fleet_service import follow_deployment

        began = time.monotonic()
        service = self.service
        uploaded = service.client.upload(bundle)
        deployment = f"demo-{name}-{os.getpid()}"
        service.client.create(
            {
                "bundle_id": uploaded["id"],
                "group": GROUP,
                "deployment_id": deployment,
                "canary": canary,
                "waves": [1.0],
                "max_failures": 0.0,
                "probation_s": self.options.probation_s,
                "p95_ms": P95_SLO_MS,
                "max_error_rate": 0.01,
                "wave_timeout_s": 120.0,
            }
        )
        waves = _waves(service.client.deployment(deployment)["device_states"])
        what = "canary " + ", ".join(waves[0]) if canary > 0 else "all devices"
        self.say(
            f"pushing {name} ({uploaded['model_version']}) to group {GROUP!r} through the fleet service: {what}; "
            f"probation {self.options.probation_s:g} s, p95 ≤ {P95_SLO_MS:g} ms…"
        )
        self._mark(deployment, "created", bundle=name, waves=waves)

        def progress(event: str, info: dict[str, Any]) -> None:
            self._mark(deployment, event, bundle=name, **info)
            if event in ("wave_started", "aborted"):
                self.say(f"  {name}: {event.replace('_', ' ')} {json.dumps(info)}")

        try:
            detail = follow_deployment(service, deployment, progress, timeout_s=300.0)
        except FleetServiceError as exc:
            raise DemoError(str(exc), log_file=service.log_file) from exc
        state = detail["state"]
        rows = [
            {
                "device_id": d["device_id"],
                "wave": d["wave"],
                "state": d["state"],
                "reason": d["reason"],
                "release": d["model_release"],
            }
            for d in detail["device_states"]
        ]
        self.result.rollouts.append(
            {
                "name": name,
                "deployment_id": deployment,
                "version": uploaded["model_version"],
                "release": uploaded["model_release"],
                "state": state,
                "reason": detail["reason"],
                "waves": waves,
                "devices": rows,
                "seconds": round(time.monotonic() - began, 1),
            }
        )
        if state != expect:
            raise DemoError(f"rollout of {name} ended {state}, expected {expect}: {detail['reason']}")
        if name == "v3":
            self._wait_release(2, "every device to serve v2 again after the rollback")
        self._step(f"rollout {name}", began, f"{state}: {detail['by_state']} — {detail['reason']}")

    def _wait_release(self, release: int, what: str, timeout: float = 180.0) -> None:
        """Until every device's newest status says ``release``. The timeout is generous: on a
        busy 2-core machine (CI runs the tests in several processes) a rollback took well over
        a minute to show; the error names each device that lags, what it said last, and its log."""
        collector = self.collector
        if collector is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lagging = [d for d in self.agent_urls if not _serves(collector.latest(d), release)]
            if not lagging:
                return
            time.sleep(0.2)
        now = time.monotonic() - self.started
        said = "; ".join(_last_said(device, collector.latest(device), now) for device in lagging)
        raise DemoError(
            f"timed out after {timeout:.0f} s waiting for {what}: {said}",
            log_file=self.processes.log_file(lagging[0]),
        )

    def serve(self, digits: Any) -> None:
        from edgesdk.workloads.digits import INPUT_NAME

        began = time.monotonic()
        self._wait_release(1, "every device to serve v1")
        validation = np.load(digits.validation)
        images, labels = validation[INPUT_NAME], validation["labels"]
        # Real files where the bundle can take them (Pillow decodes them on the device): the
        # test digits as PNGs to /predict, answered with labels; else the tensors as JSON.
        files = digit_pngs(images) if self.png_pipeline is not None else None
        self.result.digits_traffic = "PNG files to /predict" if files else "tensors to /infer"
        self.traffic = TrafficGenerator(self.agent_urls, images, labels, files=files).start()
        time.sleep(3.0)
        lines = []
        for device, stats in self.traffic.stats.items():
            if stats.requests == 0:
                raise DemoError(f"no answer from {device}'s local API: {stats.last_error or 'no request finished'}")
            lines.append(f"{device} {stats.accuracy:.0%}")
        self._step("inference", began, "local API answers, accuracy " + ", ".join(lines))

    def add_second_model(self, keys: dict[str, Path], registry: Path) -> None:
        """Install a second real model on every device beside digits, over the air, and send it
        traffic: pymicro-wakeword's ``okay_nabu.tflite`` (int8, streaming), shipped as it is and
        served by LiteRT. Skipped, and said so, where its wheel or LiteRT is missing."""
        from edgesdk.bundle import package_bundle
        from edgesdk.converters.pipeline import convert
        from edgesdk.fleet.enrollment import recipients_from_registry
        from edgesdk.workloads import wakeword

        began = time.monotonic()
        frames = wakeword.feature_frames(64)
        out = self.work / "convert-wakeword"
        try:
            source = wakeword.wakeword_tflite(self.work / "model")
            report = convert(
                source,
                self.options.profile,
                out,
                validation={wakeword.INPUT_NAME: frames[:16]},
                as_is=True,
                name=wakeword.MODEL_NAME,
            )
        except EdgeSDKError as exc:  # no wheel (ModelError), no LiteRT here: the demo goes on with one model
            self._skip_second_model(str(exc))
            return
        if not report.variants:
            self._skip_second_model("; ".join(f"{r.id}: {r.reason}" for r in report.rejected) or "no variant")
            return
        variant = report.variants[0]
        bundle = package_bundle(
            out,
            name=wakeword.MODEL_NAME,
            version="1.0.0",
            release=1,
            publisher_key=keys["publisher_key"],
            recipients=recipients_from_registry(registry),
            out=self.work / "bundles" / f"{wakeword.MODEL_NAME}-1.0.0.edgepkg",
        )
        self._step(
            "second model",
            began,
            f"{wakeword.MODEL_NAME}.tflite from pymicro-wakeword shipped as-is: {variant.id}, "
            f"{variant.size / 1024:.0f} KiB, validated in {variant.runtime.value}",
        )
        self.push("wakeword", bundle, canary=0.0, expect="SUCCEEDED")
        # The agent's public signature is float: real values, quantized by the agent with the model's parameters.
        quant = variant.inputs[0].quantization
        real = frames[16:].astype(np.float32)
        if quant is not None:
            real = (real - quant.zero_point[0]) * np.float32(quant.scale[0])
        self.second_traffic = TrafficGenerator(
            self.agent_urls,
            real,
            None,
            model=wakeword.MODEL_NAME,
            input_name=wakeword.INPUT_NAME,
            output_name=wakeword.OUTPUT_NAME,
            batch=1,
            rate_hz=10.0,
        ).start()
        self.result.second_model = {"name": wakeword.MODEL_NAME, "variant": variant.id, "size": variant.size}

    def _skip_second_model(self, reason: str) -> None:
        self.result.second_model = {"skipped": reason}
        self.say(f"[yellow]![/yellow] second model skipped: {reason}")

    def heat_wave(self) -> None:
        """Wait until the hot device has stepped down its ladder and back up to the top.

        The trace runs from the agent's start, so the first step down may already be in the
        collector's history (since v1 was loaded): the whole history is searched, not only
        what happens from now on."""
        began = time.monotonic()
        collector = self.collector
        if collector is None:
            return
        device = self.hot_device
        # The ladder's best precision (by precision, not variant id: with several formats the
        # agent picks which variant of that precision it serves).
        top = min((v["precision"] for v in self.result.conversion["variants"]), key=_rank)
        self.say(f"replaying a heat trace on {device}: the governor should step precision down and back up…")
        deadline = time.monotonic() + self.options.heat_timeout_s
        announced = False
        while time.monotonic() < deadline:
            series = [s for s in collector.snapshot()[device] if s.variant is not None]
            episode = find_step_down_and_up(series, top)
            if episode is not None:
                down, up, lowest = episode
                self.result.heat = {
                    "device": device,
                    "top": top,
                    "lowest_precision": lowest,
                    "stepped_down_at_s": down.t,
                    "back_up_at_s": up.t,
                    "max_temperature_c": max(s.temperature_c or 0.0 for s in series),
                    "repeats_every_s": sum(WAVE_S),
                }
                self._step(
                    "heat wave",
                    began,
                    f"{device} at {down.temperature_c:.0f} °C stepped down to {lowest}, "
                    f"back up to {top} at {up.temperature_c:.0f} °C",
                )
                return
            if not announced and series and series[-1].precision != top:
                announced = True
                self.say(f"  {device}: {series[-1].temperature_c:.0f} °C → serving {series[-1].variant}")
            time.sleep(0.2)
        self.result.heat = {"device": device, "observed": False}
        agent_log = self.processes.log_file(device)
        raise DemoError(
            f"{device} did not step down and back up within {self.options.heat_timeout_s:.0f} s (see {agent_log})",
            log_file=agent_log,
        )

    def finish(self, convert_v1: Path) -> None:
        from edgesdk.demo.fleet_report import write_fleet_report

        began = time.monotonic()
        if self.traffic is not None:
            self.traffic.stop()
        if self.second_traffic is not None:
            self.second_traffic.stop()
        if self.collector is not None:
            # Stop the collector's thread first: a poll of its own that began before this last
            # look would otherwise land after it, and the rows below read the last sample.
            self.collector.stop()
            self.collector.poll_once()
        samples = self.collector.snapshot() if self.collector is not None else {}
        for device in self.agent_urls:
            series = samples.get(device, [])
            last = series[-1] if series else None
            stats = self.traffic.stats[device] if self.traffic is not None else None
            latencies = np.asarray(stats.latencies_ms if stats else [], dtype=np.float64)
            precisions = sorted({s.precision for s in series if s.precision}, key=_rank)
            second = self.second_traffic.stats[device] if self.second_traffic is not None else None
            self.result.devices.append(
                {
                    "device_id": device,
                    "release": last.release if last else None,
                    "version": last.version if last else None,
                    "variant": last.variant if last else None,
                    "precisions_used": precisions,
                    "requests": stats.requests if stats else 0,
                    "failed_requests": stats.failures if stats else 0,
                    "last_request_error": (stats.last_error or None) if stats else None,
                    "accuracy": stats.accuracy if stats else None,
                    "client_p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
                    "client_p95_ms": float(np.percentile(latencies, 95)) if latencies.size else None,
                    "max_temperature_c": max((s.temperature_c or 0.0 for s in series), default=None),
                    # Why "variant" is what it is at the end: the hot device's trace repeats its
                    # heat wave, so the demo may end with it stepped down again.
                    "governor": last.governor if last else None,
                    "temperature_c": last.temperature_c if last else None,
                    # The second model's traffic ran through every later rollout of digits.
                    "second_model_requests": second.requests if second else 0,
                    "second_model_failed_requests": second.failures if second else 0,
                }
            )
        self.result.wall_s = round(time.monotonic() - self.started, 1)
        reports = self.options.reports_dir
        reports.mkdir(parents=True, exist_ok=True)
        conversion_html = reports / "conversion-report.html"
        shutil.copyfile(convert_v1 / "report.html", conversion_html)
        client_latency = {
            device: ([t - self.started for t in stats.finished_at], list(stats.latencies_ms))
            for device, stats in (self.traffic.stats.items() if self.traffic is not None else [])
        }
        fleet_html = write_fleet_report(reports / "fleet-report.html", self.result, samples, client_latency)
        self.result.reports = {"conversion": str(conversion_html), "fleet": str(fleet_html)}
        self.result.conversion["report_html"] = str(conversion_html)
        samples_json = {device: [asdict(s) for s in series] for device, series in samples.items()}
        (self.work / "samples.json").write_text(json.dumps(samples_json))
        self._step("reports", began, str(reports))
        (reports / "summary.json").write_text(json.dumps(result_json(self.result), indent=2))

    def cleanup(self) -> None:
        """Stop everything this run started, in reverse order. Never raises."""
        parts: list[Any] = [self.traffic, self.second_traffic, self.collector]
        for part in parts:
            if part is not None:
                try:
                    part.stop()
                except Exception:  # noqa: BLE001 - cleaning up: go on with the next part
                    log.exception("demo cleanup: stopping %s failed", type(part).__name__)
        self.processes.stop_all()
        if self.broker is not None:
            try:
                self.broker.stop()
            except Exception:  # noqa: BLE001 - cleaning up: the processes are already stopped
                log.exception("demo cleanup: stopping the MQTT broker failed")


def _waves(device_states: list[dict[str, Any]]) -> list[list[str]]:
    """Device ids per wave, in wave order."""
    waves: dict[int, list[str]] = {}
    for device in device_states:
        waves.setdefault(device["wave"], []).append(device["device_id"])
    return [sorted(waves[w]) for w in sorted(waves)]


def _steps(rest: tuple[Any, ...]) -> str:
    return f"[{rest[0] + 1}/{rest[1]}]" if len(rest) == 2 else ""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


_PRECISION_RANK = {"fp32": 0, "fp16": 1, "bf16": 1, "int8": 2, "int4": 3}


def _rank(precision: str) -> int:
    return _PRECISION_RANK.get(precision, 9)


def find_step_down_and_up(series: list[Sample], top: str) -> tuple[Sample, Sample, str] | None:
    """The first episode in ``series`` where the device left precision ``top`` and came back
    to it: (first sample below top, first sample back on top, lowest precision in between)."""
    down: Sample | None = None
    lowest = ""
    for sample in series:
        precision = sample.precision or ""
        if down is None:
            if precision != top:
                down, lowest = sample, precision
        elif precision == top:
            return down, sample, lowest
        elif _rank(precision) > _rank(lowest):
            lowest = precision
    return None


def result_json(result: DemoResult) -> dict[str, Any]:
    """The machine-readable summary (``edgesdk demo --json``)."""
    return {
        "profile": result.profile,
        "workdir": result.workdir,
        "wall_s": result.wall_s,
        "steps": result.steps,
        "conversion": result.conversion,
        "devices": result.devices,
        "rollouts": [
            {k: v for k, v in r.items() if k != "devices"} | {"devices": r["devices"]} for r in result.rollouts
        ],
        "heat": result.heat,
        "reports": result.reports,
        "service": result.service,
        "second_model": result.second_model,
        "digits_traffic": result.digits_traffic,
    }


def _serves(sample: Sample | None, release: int) -> bool:
    return sample is not None and sample.release == release


def _last_said(device: str, sample: Sample | None, now: float) -> str:
    """What a device's newest status said, for a timeout's message."""
    if sample is None:
        return f"{device} never answered /v1/status"
    return (
        f"{device} serves release {sample.release} ({sample.variant}), update {sample.ota_state}, "
        f"status read {now - sample.t:.0f} s ago"
    )
