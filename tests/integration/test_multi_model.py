"""Two models on one device, with real agent processes (and a real mosquitto for the OTA part):
model B keeps answering while model A is updated, rolled back (probation fails) and SIGKILLed in
the middle of an update; an install over the memory budget is refused with the figures before
anything is staged; a corrupt store of one model leaves the other serving; a single-model data
dir is migrated at start with its rollback floor.

Model A is the digits CNN (``digits``); model B is the same network packaged as a second model
(``digits-b``): a second real model, as far as the agent can tell, at the digits model's cost."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from edgesdk.agent.ota.states import UpdateState

from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, agent_env, make_device, run_agent_cli
from tests.conftest import assert_one_line_error
from tests.faulty_agent import faulty_agent_argv, faulty_agent_env
from tests.mqtt_helpers import Collector
from tests.ota_helpers import Operator, OtaBundles, build_ota_bundles, make_mqtt_device

pytest.importorskip("onnxruntime")

B = "digits-b"
IMAGE = json.dumps({"inputs": {"image": [[[[0.0] * 8] * 8]]}}).encode()


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    from edgesdk.bundle import package_bundle

    pytest.importorskip("paho.mqtt")
    root = tmp_path_factory.mktemp("multi-model-bundles")
    bundles = build_ota_bundles(digits, root)

    def pack(name: str, version: str, release: int) -> Path:
        return package_bundle(
            root / "convert",
            name=name,
            version=version,
            release=release,
            publisher_key=bundles.keys.publisher_key,
            recipients=[bundles.keys.device_pub],
            out=root / f"{name}-{release}.edgepkg",
        )

    bundles.extra.update(
        {"a3": pack("digits", "1.3.0", 3), "a4": pack("digits", "1.4.0", 4), "b1": pack(B, "1.0.0", 1)}
    )
    return bundles


def infer(url: str, model: str) -> int:
    request = urllib.request.Request(
        f"{url}/v1/models/{model}/infer", data=IMAGE, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def status(url: str) -> dict:
    with urllib.request.urlopen(url + "/v1/status", timeout=10) as response:
        return json.loads(response.read())


def served(url: str) -> dict[str, int]:
    """Model name → release serving, from /v1/status's per-model list."""
    return {m["name"]: m["running"]["release"] for m in status(url)["models"] if m["running"]}


def tree_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


class Traffic:
    """Requests to one model in a loop; every answer that is not 200 is a failure."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.ok = 0
        self.failures: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                code = infer(self.url, self.model)
            except OSError:
                code = -1
            if code == 200:
                self.ok += 1
            else:
                self.failures.append(code)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def install(device, bundle: Path):
    return run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))


def test_model_b_never_fails_while_model_a_is_updated_rolled_back_and_killed(tmp_path, bundles, mqtt_broker) -> None:
    device = make_mqtt_device(tmp_path / "device", bundles, mqtt_broker.url)
    for bundle in (bundles.v1, bundles.extra["b1"]):
        proc = install(device, bundle)
        assert proc.returncode == 0, proc.stderr
    b_store = device.model_dir(B)
    b_before = tree_hashes(b_store)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    try:
        with AgentProcess(device) as agent:
            assert served(agent.url) == {"digits": 1, B: 1}
            presence = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/presence", client_id="presence-watch")
            deadline = time.monotonic() + 60
            while not [p for p in presence.json("presence") if p["online"]]:
                assert time.monotonic() < deadline, "no retained presence"
                time.sleep(0.1)
            online = [p for p in presence.json("presence") if p["online"]][-1]
            presence.client.stop()
            assert [m["name"] for m in online["models"]] == ["digits", B]  # presence lists every model
            with Traffic(agent.url, B) as traffic_b, Traffic(agent.url, "digits") as traffic_a:
                committed = operator.push(bundles.v2, HealthCriteria(probation_s=1))
                operator.thread.join(180)
                assert operator.device_row(committed).state == "COMMITTED"
                # Probation fails (no latency meets 1 µs): A goes back to release 2.
                rolled = operator.push(bundles.extra["a3"], HealthCriteria(probation_s=2, p95_latency_ms=0.001))
                operator.thread.join(180)
                assert operator.device_row(rolled).state == "ROLLED_BACK"
                assert served(agent.url) == {"digits": 2, B: 1}
            assert traffic_b.failures == [] and traffic_b.ok > 0, traffic_b.failures[:5]
            assert traffic_a.failures == [] and traffic_a.ok > 0, traffic_a.failures[:5]
            listed = status(agent.url)
            assert [m["name"] for m in listed["models"]] == ["digits", B]  # the default model first
            assert listed["memory"]["model_budget_mb"] == 3072 and set(listed["memory"]["models"]) == {"digits", B}
        assert tree_hashes(b_store) == b_before  # A's update, commit and rollback never touched B
        # SIGKILL while A's next update is ACTIVATING: the whole process dies (B with it); at the
        # next start A rolls back and B serves its release from its untouched store at once.
        killed = AgentProcess(
            device,
            argv=faulty_agent_argv(device.config, kill_at=UpdateState.ACTIVATING),
            env=faulty_agent_env(agent_env()),
        ).start()
        try:
            kill_deployment = operator.push(bundles.extra["a4"], HealthCriteria(probation_s=1))
            killed.proc.wait(120)
            assert killed.proc.returncode == -9, killed.log()[-3000:]
        finally:
            killed.stop()
        assert tree_hashes(b_store) == b_before
        with AgentProcess(device) as agent:
            assert infer(agent.url, B) == 200  # B first: its store was never part of A's update
            operator.thread.join(180)
            assert operator.device_row(kill_deployment).state == "ROLLED_BACK"
            assert served(agent.url) == {"digits": 2, B: 1}
            assert infer(agent.url, "digits") == 200
    finally:
        operator.close()


def with_load_size(convert_dir: Path, out: Path, load_mb: float) -> Path:
    """A copy of ``convert_dir`` whose report says each variant measured ``load_mb`` while loading."""
    shutil.copytree(convert_dir, out)
    report = json.loads((out / "report.json").read_text())
    for variant in report["variants"]:
        variant.setdefault("measurements", {})["peak_rss_mb"] = load_mb
    (out / "report.json").write_text(json.dumps(report))
    return out


def test_an_install_over_the_memory_budget_is_refused_with_the_figures(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")  # rpi5-8gb: a 3072 MB model budget
    big_a = with_load_size(convert_dir, tmp_path / "a", 1000.0)  # 2 precisions: 2000 MB
    assert install(device, device.bundle(big_a, version="1.0.0", release=1)).returncode == 0
    big_b = with_load_size(convert_dir, tmp_path / "b", 600.0)  # 1200 MB > 1072 MB free
    proc = install(device, device.bundle(big_b, version="1.0.0", release=1, name=B))
    assert_one_line_error(proc, "needs 1200.0 MB", "1072.0 MB", "3072 MB model budget", "digits 2000.0 MB")
    assert not (device.model_dir(B) / "slots" / "a" / "bundle.edgepkg").exists()  # nothing staged
    # An update of A itself is measured without A's current size: 2 x 1200 MB fits.
    bigger_a = with_load_size(convert_dir, tmp_path / "a2", 1200.0)
    assert install(device, device.bundle(bigger_a, version="1.1.0", release=2)).returncode == 0
    # The figure is the one the converter recorded, carried in the manifest of each variant.
    from edgesdk.bundle import inspect_bundle

    manifest = inspect_bundle(device.root / "digits-1.1.0.edgepkg").manifest
    assert {v.load_rss_mb for v in manifest.variants} == {1200.0}


def test_a_corrupt_store_of_one_model_leaves_the_other_serving(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    assert install(device, device.bundle(convert_dir, version="1.0.0", release=1)).returncode == 0
    assert install(device, device.bundle(convert_dir, version="1.0.0", release=1, name=B)).returncode == 0
    bundle = device.model_dir(B) / "slots" / "a" / "bundle.edgepkg"
    data = bytearray(bundle.read_bytes())
    for offset in range(len(data) // 2, len(data), 512):  # the payloads: authentication fails as they load
        data[offset] ^= 0xFF
    bundle.write_bytes(bytes(data))
    with AgentProcess(device) as agent:
        assert infer(agent.url, "digits") == 200
        assert infer(agent.url, B) == 503  # installed but not loadable, and said so; A untouched
        report = status(agent.url)
        assert report["model"]["name"] == "digits"
        assert any(p.startswith(f"{B}: ") for p in report["problems"]), report["problems"]
        assert not any(p.startswith("digits: ") for p in report["problems"]), report["problems"]
    # B is repaired by installing it again, into the slot that is not its broken one; A untouched.
    a_before = tree_hashes(device.model_dir())
    assert install(device, device.bundle(convert_dir, version="1.0.1", release=2, name=B)).returncode == 0
    assert tree_hashes(device.model_dir()) == a_before


def test_a_single_model_data_dir_is_migrated_with_its_floor(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    assert install(device, device.bundle(convert_dir, version="1.0.0", release=1)).returncode == 0
    assert install(device, device.bundle(convert_dir, version="2.0.0", release=2)).returncode == 0
    # The layout a single-model agent wrote (the same store files, at the top of the data dir).
    model_dir = device.model_dir()
    for item in ("slots", "store.json", "rollback_floor", "ota/state.json"):
        (model_dir / item).rename(device.data_dir / item)
    shutil.rmtree(device.data_dir / "models")
    with AgentProcess(device) as agent:
        assert served(agent.url) == {"digits": 2}
        assert infer(agent.url, "digits") == 200
    assert not (device.data_dir / "store.json").exists() and (model_dir / "store.json").exists()
    assert json.loads((device.data_dir / "models" / "index.json").read_text()) == {
        "committed": ["digits"],
        "default": "digits",
    }
    # The floor came along: release 1 is still refused.
    old = install(device, device.root / "digits-1.0.0.edgepkg")
    assert_one_line_error(old, "below this device's rollback floor 2")
