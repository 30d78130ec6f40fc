"""Shared by the OTA tests and benchmark: real bundles of the digits CNN in several flavours,
signed deployments for them, and a stand-in agent built from the real agent parts
(SlotStore, ModelServer, Metrics, EventBus) for in-process tests and simulated fleets."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_hashes
from edgesdk.protocol.signing import sign_deployment
from edgesdk.schemas.messages import Deployment, HealthCriteria
from tests.bundle_helpers import KeySet, make_digits_convert_dir, make_keys

PROFILE = "rpi5-8gb"


@dataclass
class OtaBundles:
    """Keys and bundle files for the OTA scenarios (release numbers in the names)."""

    keys: KeySet
    operator_key: Path
    operator_pub: Path
    v1: Path
    v2: Path
    v3_bad_golden: Path
    v4_other_profile: Path
    v5_untrusted_signer: Path
    extra: dict[str, Path] = field(default_factory=dict)


def _with_wrong_golden(convert_dir: Path, out: Path) -> Path:
    """A copy of ``convert_dir`` whose golden outputs disagree with the model (smoke test fails)."""
    shutil.copytree(convert_dir, out)
    golden = dict(np.load(out / "golden.npz"))
    golden["output:logits"] = np.roll(golden["output:logits"], 3, axis=1)
    buffer = io.BytesIO()
    np.savez(buffer, **golden)  # type: ignore[arg-type]
    (out / "golden.npz").write_bytes(buffer.getvalue())
    return out


def build_ota_bundles(digits: Any, root: Path) -> OtaBundles:
    from edgesdk.bundle import package_bundle
    from edgesdk.keys import generate_publisher_key

    root.mkdir(parents=True, exist_ok=True)
    keys = make_keys(root / "keys")
    operator_key, operator_pub = generate_publisher_key(root / "keys" / "operator")
    stranger_key, _ = generate_publisher_key(root / "keys" / "stranger")
    convert = make_digits_convert_dir(digits, root / "convert", profile=PROFILE, int8=False)
    bad = _with_wrong_golden(convert, root / "convert-bad-golden")

    def pack(source: Path, name: str, version: str, release: int, **kwargs: Any) -> Path:
        return package_bundle(
            source,
            name="digits",
            version=version,
            release=release,
            publisher_key=kwargs.pop("publisher_key", keys.publisher_key),
            recipients=[keys.device_pub],
            out=root / f"{name}.edgepkg",
            **kwargs,
        )

    return OtaBundles(
        keys=keys,
        operator_key=operator_key,
        operator_pub=operator_pub,
        v1=pack(convert, "v1", "1.0.0", 1),
        v2=pack(convert, "v2", "1.1.0", 2),
        v3_bad_golden=pack(bad, "v3-bad-golden", "1.2.0", 3),
        v4_other_profile=pack(convert, "v4-other-profile", "1.3.0", 4, targets=["jetson-orin-nano-8gb"]),
        v5_untrusted_signer=pack(convert, "v5-untrusted", "1.4.0", 5, publisher_key=stranger_key),
    )


def make_mqtt_device(root: Path, bundles: OtaBundles, broker_url: str, **settings: Any) -> Any:
    """A device (``tests.agent_helpers.Device``) whose agent talks to ``broker_url``, trusting the
    bundles' publisher and operator keys, governor off; ``settings`` replace config sections."""
    from tests.agent_helpers import Device

    data_dir = root / "data"
    data_dir.mkdir(parents=True, mode=0o700)
    from edgesdk.agent.security_state import create_with_new_key

    create_with_new_key(data_dir, bundles.keys.device_key)  # the shared test key's record in this data dir
    device = Device(
        root,
        data_dir,
        bundles.keys.publisher_key,
        bundles.keys.publisher_pub,
        bundles.keys.device_pub,
        root / "agent.toml",
    )
    config: dict[str, Any] = {
        "device_key": str(bundles.keys.device_key),
        "publisher_keys": [str(bundles.keys.publisher_pub), str(bundles.operator_pub)],
        "governor": {"enabled": False, "source": "psutil"},
        "mqtt": {"enabled": True, "broker": broker_url, "telemetry_interval_s": 3600},
    }
    device.write_config(**{**config, **settings})
    return device


def make_deployment(
    bundle: Path,
    deployment_id: str,
    operator_key: Path,
    *,
    health: HealthCriteria | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    url: str | None = None,
    action: str = "install",
    targets: list[str] | None = None,
    target_groups: list[str] | None = None,
    sequence: int | None = None,
    issued_at: datetime | None = None,
    ttl_s: float = 3600.0,
) -> Deployment:
    """A signed deployment of ``bundle`` (manifest fields read from the file, unverified), for
    ``targets`` (default dev-1, the StandInAgent's id), valid ``ttl_s`` from ``issued_at`` (now)
    and numbered ``sequence`` (default: the next of a per-process counter)."""
    from edgesdk.bundle import inspect_bundle
    from edgesdk.keys import load_publisher_private_key

    model = inspect_bundle(bundle).manifest.model
    data = bundle.read_bytes()
    issued = issued_at or datetime.now(timezone.utc)
    deployment = Deployment(
        deployment_id=deployment_id,
        issued_at=issued,
        expires_at=issued + timedelta(seconds=ttl_s),
        sequence=next_sequence() if sequence is None else sequence,
        model_name=model.name,
        model_version=model.version,
        release=model.release,
        bundle_sha256=hashlib.sha256(data).hexdigest(),
        bundle_size=len(data),
        chunk_size=chunk_size,
        chunk_sha256=[] if url else chunk_hashes(bundle, chunk_size),
        url=url,
        health=health or HealthCriteria(probation_s=1.0),
        action=action,  # type: ignore[arg-type]
        targets=targets if targets is not None or target_groups else ["dev-1"],
        target_groups=target_groups or [],
    )
    return sign_deployment(deployment, load_publisher_private_key(operator_key))


_sequence = itertools.count(1)


def next_sequence() -> int:
    """Strictly increasing within this process, like an operator's database."""
    return next(_sequence)


def command_fields(device_id: str = "dev-1", *, ttl_s: float = 3600.0) -> dict[str, Any]:
    """The freshness and audience fields a version-2 Deployment needs, for tests that build one."""
    now = datetime.now(timezone.utc)
    return {
        "issued_at": now,
        "expires_at": now + timedelta(seconds=ttl_s),
        "sequence": next_sequence(),
        "targets": [device_id],
    }


class StandInAgent:
    """The contract surface of edgesdk.agent.daemon.Agent, from the real parts, without the API."""

    def __init__(
        self,
        data_dir: Path,
        bundles: OtaBundles,
        *,
        device_id: str = "dev-1",
        link: Any = None,
        broker_url: str | None = None,
        groups: tuple[str, ...] = (),
    ) -> None:
        from edgesdk.agent.events import EventBus
        from edgesdk.agent.metrics import InferenceStats, Metrics
        from edgesdk.agent.serving import ModelServer
        from edgesdk.agent.slot_store import SlotStore

        from edgesdk.keys import load_publisher_public_key
        from edgesdk.profiles import get_profile
        from edgesdk.schemas.agent_config import AgentConfig

        # Telemetry is not what these tests look at; a long interval keeps the broker quiet.
        mqtt = {"enabled": broker_url is not None, "groups": list(groups), "telemetry_interval_s": 3600}
        if broker_url is not None:
            mqtt["broker"] = broker_url
        self.config = AgentConfig.model_validate(
            {"device_id": device_id, "profile": PROFILE, "data_dir": data_dir, "mqtt": mqtt}
        )
        self.profile = get_profile(PROFILE)
        self.events = EventBus()
        self.store = SlotStore(data_dir)
        stats = InferenceStats()
        self.server = ModelServer(
            profile=self.profile, events=self.events, observe=stats.observe, count_error=stats.count_error
        )
        self.metrics = Metrics(self.server, stats=stats)
        self.device_key = bundles.keys.device()
        self.device_public_key = self.device_key.public_key().public_bytes_raw
        self.trusted_publishers = [
            load_publisher_public_key(bundles.keys.publisher_pub),
            load_publisher_public_key(bundles.operator_pub),
        ]
        self.trusted_operators = self.trusted_publishers  # no trust document: one key set, both roles
        self.link = link
        if broker_url is not None and link is None:
            from tests.agent_wiring_helpers import start_link

            self.link = start_link(self)
        verified = self.store.load_active(self.trusted_publishers, self.profile)
        if verified is not None:
            self.server.swap(verified, self.device_key)

    def infer_once(self) -> np.ndarray:
        image = np.zeros((1, 1, 8, 8), dtype=np.float32)
        return self.server.infer("digits", {"image": image})["logits"]


def statuses(published: list[Any]) -> list[str]:
    return [json.loads(p.model_dump_json())["state"] for p in published]


class Operator:
    """A rollout controller over a real broker pushing to dev-1 (the agent-process OTA tests)."""

    def __init__(self, root: Path, bundles: OtaBundles, broker_url: str) -> None:
        from edgesdk.fleet.rollout import RolloutController
        from edgesdk.fleet.service.operator_db import open_rollout_store
        from edgesdk.keys import load_publisher_private_key
        from edgesdk.mqtt.client import ClientOptions, MqttClient

        self.client = MqttClient(
            ClientOptions(client_id=f"op-{time.monotonic_ns()}", broker_url=broker_url, clean_start=True)
        )
        self.client.start()
        assert self.client.wait_connected(60)
        self.ctl = RolloutController(
            open_rollout_store(root / "fleet.sqlite3"),
            self.client,
            "edgesdk",
            load_publisher_private_key(bundles.operator_key),
            poll_s=0.05,
        ).start()
        self.result: dict[str, str] = {}

    def push(
        self,
        bundle: Path,
        health: HealthCriteria,
        artifact_urls: tuple[str, ...] = (),
        *,
        mqtt_fallback: bool = True,
        chunk_size: int = 32 * 1024,
    ) -> str:
        # max_failures 100%: the controller only waits for the device's final word here.
        from edgesdk.fleet.rollout import RolloutPlan

        plan = RolloutPlan(
            canary=0.0, waves=(1.0,), max_failures=1.0, probation_s=health.probation_s, wave_timeout_s=240
        )
        message = self.ctl.create(
            bundle,
            ["dev-1"],
            plan,
            health=health,
            chunk_size=chunk_size,
            artifact_urls=artifact_urls,
            mqtt_fallback=mqtt_fallback,
        )
        self.thread = threading.Thread(
            target=lambda: self.result.setdefault("state", self.ctl.run(message.deployment_id))
        )
        self.thread.start()
        return message.deployment_id

    def device_row(self, deployment_id: str):
        self.ctl._drain_statuses()
        return self.ctl.store.devices(deployment_id)[0]

    def close(self) -> None:
        self.ctl.stop()
        if hasattr(self, "thread"):
            self.thread.join(30)
        self.client.stop()
