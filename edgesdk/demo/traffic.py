"""Client traffic against each agent's local inference API, as an application would send it.

One thread per device posts small batches of samples (the digits test split; the wake-word
spotter's feature chunks) as JSON — or, where the bundle has a pipeline, one real file per
request (the test digits as PNGs) to ``/predict`` — over one kept-alive connection, at a steady
rate; it records
the round-trip latency and, where there are labels, how many answers were right. The agents'
probation monitors judge new models on this traffic too.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np


@dataclass
class DeviceTraffic:
    device_id: str
    requests: int = 0
    failures: int = 0
    images: int = 0
    correct: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)  # time.monotonic() per answered request
    last_error: str = ""

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.images if self.images else None


class TrafficGenerator:
    """Sends ``rate_hz`` requests per second of ``batch`` samples to every agent until stopped.

    ``labels`` (one per sample) score the answers' argmax; ``None`` only checks that every
    answer carries ``output_name``. With ``files`` (one encoded image per sample) each request
    posts one of them to ``/predict`` instead, and its answer's top label is scored."""

    def __init__(
        self,
        agents: dict[str, str],
        images: np.ndarray,
        labels: np.ndarray | None,
        *,
        model: str = "digits",
        input_name: str = "image",
        output_name: str = "logits",
        batch: int = 4,
        rate_hz: float = 15.0,
        files: list[bytes] | None = None,
    ) -> None:
        self.agents = dict(agents)
        self.images = images
        self.files = files
        self.labels = labels
        self.model = model
        self.input_name = input_name
        self.output_name = output_name
        self.batch = batch
        self.period_s = 1.0 / rate_hz
        self.stats = {device: DeviceTraffic(device) for device in agents}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(device, url), name=f"traffic-{device}", daemon=True)
            for device, url in self.agents.items()
        ]

    def start(self) -> TrafficGenerator:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self, device: str, url: str) -> None:
        stats = self.stats[device]
        parsed = urlparse(url)
        conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=10)
        offset = hash(device) % len(self.images)
        files = self.files
        path = f"/v1/models/{self.model}/{'predict' if files else 'infer'}"
        batch = 1 if files else self.batch
        while not self._stop.is_set():
            began = time.monotonic()
            index = (offset + np.arange(batch)) % len(self.images)
            offset += batch
            if files:
                body, content_type = files[int(index[0])], "image/png"
            else:
                body = json.dumps({"inputs": {self.input_name: self.images[index].tolist()}}).encode()
                content_type = "application/json"
            try:
                conn.request("POST", path, body=body, headers={"content-type": content_type})
                response = conn.getresponse()
                payload = response.read()
                elapsed_ms = (time.monotonic() - began) * 1000.0
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}: {payload[:200]!r}")
                answered = json.loads(payload)
                # The class each sample was given: the top label's index, or the logits' argmax.
                if files:
                    classes = np.array([int(answered["labels"][0]["label"])])
                else:
                    classes = np.asarray(answered["outputs"][self.output_name]).argmax(axis=-1)
                stats.requests += 1
                stats.latencies_ms.append(elapsed_ms)
                stats.finished_at.append(time.monotonic())
                if self.labels is not None:
                    stats.images += len(index)
                    stats.correct += int((classes == self.labels[index]).sum())
            except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
                stats.failures += 1
                stats.last_error = str(exc)
                conn.close()  # a fresh connection next time
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - began)))
        conn.close()
