"""The capture uploader (agent/capture/upload.py) with a stand-in link: it hands the oldest unsent
file to the outbox only when the outbox is empty, never sends a file twice (not after a restart
either), waits for a link, takes its acks on a link attached before it connects; and
``[capture] upload = true`` without ``[mqtt]`` is refused at start in one line."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from edgesdk.agent.capture.start import start_capture
from edgesdk.agent.capture.upload import CaptureUploader, model_of

from edgesdk.capture.upload import CaptureUpload
from edgesdk.errors import ConfigError
from edgesdk.schemas.agent_config import AgentConfig


class _Outbox:
    depth = 0


class _Client:
    connected = True


class _Link:
    def __init__(self) -> None:
        self.client = _Client()
        self.queue = _Outbox()
        self.sent: list[tuple[str, CaptureUpload]] = []
        self.handlers: dict[str, Any] = {}
        self.subscriptions: list[str] = []

    def subscribe(self, suffix: str, handler: Any) -> None:
        self.handlers[suffix] = handler
        self.subscriptions.append(suffix)

    def publish_reliable(self, suffix: str, message: CaptureUpload) -> int:
        self.sent.append((suffix, message))
        return len(self.sent)


def _file(directory: Path, second: int, model: str, size: int = 10) -> Path:
    path = directory / f"20261205T0000{second:02d}.000000Z-{second:06d}-{model}.edgecap"
    path.write_bytes(bytes([second]) * size)
    return path


def test_the_uploader_sends_oldest_first_one_at_a_time_and_never_twice(tmp_path: Path) -> None:
    first, second = _file(tmp_path, 1, "digits"), _file(tmp_path, 2, "mobilenet-v2")
    link = _Link()
    uploader = CaptureUploader(tmp_path, "dev-1", lambda: link)
    link.queue.depth = 1  # the outbox still holds a message: wait
    assert not uploader.send_next() and link.sent == []
    link.queue.depth, link.client.connected = 0, False  # offline: the file waits on disk
    assert not uploader.send_next() and link.sent == []
    link.client.connected = True
    assert uploader.send_next()
    suffix, message = link.sent[0]
    assert suffix == "capture" and message.name == first.name and message.model == "digits"
    assert message.content() == first.read_bytes()
    assert message.sha256 == hashlib.sha256(first.read_bytes()).hexdigest()
    assert uploader.send_next() and link.sent[1][1].model == "mobilenet-v2"
    assert not uploader.send_next()
    assert first.exists() and second.exists()  # kept within the disk budget, not deleted on send

    restarted = CaptureUploader(tmp_path, "dev-1", lambda: link)
    assert not restarted.send_next() and len(link.sent) == 2


def test_the_uploader_waits_for_the_link(tmp_path: Path) -> None:
    small = _file(tmp_path, 2, "digits")
    link: Any = None
    uploader = CaptureUploader(tmp_path, "dev-1", lambda: link)
    assert not uploader.send_next()  # no link made yet
    link = _Link()
    assert uploader.send_next()
    assert [m.name for _, m in link.sent] == [small.name] and small.exists()
    assert model_of("odd.edgecap") == ""


def test_the_uploader_takes_its_acks_on_a_link_attached_before_it_connects(tmp_path: Path) -> None:
    """Attached when the link is made (before it connects), the ack handler is there for an ack the
    broker kept for the device while the agent was down; the first send does not subscribe again."""
    sent = _file(tmp_path, 3, "digits")
    link = _Link()
    link.client.connected = False
    uploader = CaptureUploader(tmp_path, "dev-1", lambda: link)
    uploader.attach(link)
    assert link.subscriptions == ["capture/ack"]
    link.client.connected = True
    assert uploader.send_next()
    sha256 = hashlib.sha256(sent.read_bytes()).hexdigest()
    link.handlers["capture/ack"](f'{{"device_id": "dev-1", "sha256": "{sha256}"}}'.encode())
    assert not sent.exists() and link.subscriptions == ["capture/ack"]


def test_capture_upload_without_mqtt_is_refused_in_one_line(tmp_path: Path) -> None:
    config = AgentConfig.model_validate(
        {"device_id": "dev-1", "profile": "rpi5-8gb", "capture": {"rate": 1.0, "upload": True}}
    )
    with pytest.raises(ConfigError, match=r"upload = true .* \[mqtt\] enabled is false"):
        start_capture(config, object(), tmp_path, link=lambda: None)


def test_a_ledger_line_cut_by_a_kill_resumes_from_the_line_before_it(tmp_path: Path) -> None:
    """A SIGKILL while a line was appended leaves it cut: the file's previous line holds, so the
    upload goes on from the chunk after it (read as an old name-only line, the file could not be
    acknowledged and waited 6 h to be sent again whole)."""
    big = _file(tmp_path, 4, "digits", size=3 * 512 * 1024 - 100)  # three chunks
    sha256 = hashlib.sha256(big.read_bytes()).hexdigest()
    (tmp_path / ".uploaded").write_text(f"{big.name} {sha256} 0 3\n{big.name} {sha256} 1")
    link = _Link()
    uploader = CaptureUploader(tmp_path, "dev-1", lambda: link)
    assert uploader.send_next()
    assert [(m.name, m.index, m.count) for _, m in link.sent] == [(big.name, 1, 3)]
    assert (tmp_path / ".uploaded").read_text().splitlines()[-1] == f"{big.name} {sha256} 1 3"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([big.name, ".uploaded"])  # no .new left
