"""The unseal helper process: it verifies and decrypts exactly as in process, its refusals keep
their error class (so the daemon's fallback works the same), and a helper that dies, hangs or
sends bytes that are not the signed ones never gets a byte to a runtime."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from edgesdk.agent import unseal
from edgesdk.agent.unseal import OpenedBundle, Unsealer

from edgesdk.bundle import decrypt_variant
from edgesdk.errors import AgentError, EdgeSDKError, IntegrityError
from edgesdk.keys import generate_device_key
from tests.unit.test_bundle_verify import copy_bundle, env, position_of, verify

__all__ = ["env"]  # test_bundle_verify's module fixture: one bundle with two variants


def helper(env: dict[str, Any], **kwargs: Any) -> Unsealer:
    kwargs.setdefault("device_key", env["keys"].device_key)
    return Unsealer(publisher_keys=[env["keys"].publisher_pub], **kwargs)


def reopen(unsealer: Unsealer, path: Path, installed: Any) -> OpenedBundle:
    return unsealer.verify_installed(
        path,
        installed_front_sha256=installed.front_sha256,
        installed_sha256=installed.sha256,
        profile="rpi5-8gb",
    )


def test_helper_verifies_and_decrypts_what_in_process_does(env) -> None:
    installed = verify(env["bundle"], env)
    with helper(env) as unsealer:
        opened = reopen(unsealer, env["bundle"], installed)
        assert opened.manifest == installed.manifest
        assert (opened.sha256, opened.front_sha256, opened.size) == (
            installed.sha256,
            installed.front_sha256,
            installed.size,
        )
        assert opened.publisher_key_id == installed.publisher_key_id and opened.payloads_hashed is False
        for variant_id, files in env["files"].items():
            assert (
                unsealer.decrypt(opened, variant_id)
                == files
                == decrypt_variant(installed, variant_id, env["keys"].device())
            )
        # A full verification (a slot staged before front hashes were recorded) hashes payloads.
        full = unsealer.verify(env["bundle"], profile="rpi5-8gb", allow_expired=True)
        assert full.payloads_hashed is True and full.sha256 == installed.sha256
        proc = unsealer._proc
        assert proc is not None and proc.poll() is None
    assert proc.wait(timeout=10) == 0  # closing the pipe ends the helper


@pytest.mark.parametrize(
    ("region", "step", "error"),
    [
        ("signature-first", "open", "SignatureError"),
        ("manifest-middle", "open", None),  # whatever in-process verification raises
        ("segment-0-tag-last", "decrypt", "IntegrityError"),
    ],
)
def test_refusals_keep_their_error_class(env, tmp_path, region, step, error) -> None:
    installed = verify(env["bundle"], env)
    bad = copy_bundle(env, tmp_path)
    data = bytearray(bad.read_bytes())
    data[position_of(region, bad)] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(EdgeSDKError) as in_process:
        from edgesdk.bundle import verify_installed_bundle

        reopened = verify_installed_bundle(
            bad,
            trusted_publishers=[env["keys"].publisher_pub],
            installed_front_sha256=installed.front_sha256,
            installed_sha256=installed.sha256,
        )
        decrypt_variant(reopened, "onnx-fp32", env["keys"].device())
    with helper(env) as unsealer, pytest.raises(EdgeSDKError) as helped:
        opened = reopen(unsealer, bad, installed)
        assert step == "decrypt", "the helper opened a bundle that is refused in process"
        unsealer.decrypt(opened, "onnx-fp32")
    assert type(helped.value) is type(in_process.value)
    assert error is None or type(helped.value).__name__ == error
    assert str(helped.value) == str(in_process.value)  # the same one-line reason


def test_wrong_device_key_is_the_variants_problem_not_a_crash(env, tmp_path) -> None:
    other, _ = generate_device_key(tmp_path / "other")
    installed = verify(env["bundle"], env)
    with helper(env, device_key=other) as unsealer:
        opened = reopen(unsealer, env["bundle"], installed)
        with pytest.raises(EdgeSDKError) as exc_info:
            unsealer.decrypt(opened, "onnx-fp32")
        assert not isinstance(exc_info.value, IntegrityError)  # no key slot: not rot
        assert unsealer._proc is not None and unsealer._proc.poll() is None  # still answering


def test_a_helper_that_died_is_replaced_and_reopens_the_bundle(env) -> None:
    installed = verify(env["bundle"], env)
    with helper(env) as unsealer:
        opened = reopen(unsealer, env["bundle"], installed)
        first = unsealer._proc
        assert first is not None
        first.kill()
        first.wait()
        with pytest.raises(AgentError, match="unseal helper exited with -9 during decrypt"):
            unsealer.decrypt(opened, "onnx-fp32")
        # The next variant gets a new helper, which opens the bundle again before decrypting.
        assert unsealer.decrypt(opened, "openvino-int8") == env["files"]["openvino-int8"]
        assert unsealer._proc is not first


def test_a_hanging_helper_is_killed_after_its_timeout(env, tmp_path) -> None:
    import subprocess

    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    with helper(env, timeout_s=0.5) as unsealer:
        # Stands in for a helper stuck before it answers.
        unsealer._proc = subprocess.Popen([sys.executable, str(sleeper)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with pytest.raises(AgentError, match="did not answer within 0.5 s and was killed during open"):
            unsealer.verify(env["bundle"], profile="rpi5-8gb", allow_expired=True)


def test_a_helper_that_cannot_start_is_one_clear_error(env, monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with helper(env) as unsealer, pytest.raises(AgentError, match="cannot start the unseal helper"):
        unsealer.verify(env["bundle"], allow_expired=True)


def test_plaintext_that_is_not_the_signed_one_never_reaches_a_runtime(env) -> None:
    installed = verify(env["bundle"], env)
    with helper(env) as unsealer:
        opened = reopen(unsealer, env["bundle"], installed)
        # As if the pipe delivered other bytes: the daemon's own check against the manifest.
        variants = [v.model_copy(update={"sha256": "0" * 64}) for v in opened.manifest.variants]
        opened.manifest = opened.manifest.model_copy(update={"variants": variants})
        with pytest.raises(IntegrityError, match="not the signed one"):
            unsealer.decrypt(opened, "onnx-fp32")


def test_frames_round_trip_and_broken_streams_are_eof() -> None:
    stream = io.BytesIO()
    unseal._send(stream, {"ok": True}, [b"ab", memoryview(b"cde"), b""])
    stream.seek(0)
    assert unseal._receive(stream) == ({"ok": True, "parts": [2, 3, 0]}, [b"ab", b"cde", b""])
    empty = io.BytesIO()
    unseal._send(empty, {"op": "x"})
    empty.seek(0)
    assert unseal._receive(empty) == ({"op": "x"}, [])
    for broken in (
        b"",  # nothing
        b"\x00\x00",  # half a length
        b"\x00\x00\x00\x09{}",  # header shorter than its length
        b"\xff\xff\xff\xff",  # absurd header length
        b"\x00\x00\x00\x02[]",  # header not an object
        b"\x00\x00\x00\x02{x",  # header not JSON
        b'\x00\x00\x00\x0e{"parts":[-1]}',  # negative part size
        b'\x00\x00\x00\x0e{"parts":[10]}short',  # payload cut short
    ):
        with pytest.raises(EOFError):
            unseal._receive(io.BytesIO(broken))


def test_unknown_errors_become_agent_errors_and_known_ones_keep_their_class() -> None:
    with pytest.raises(IntegrityError, match="x"):
        unseal._raise_from({"ok": False, "error": "IntegrityError", "message": "x"})
    for name in ("ValueError", "os", "__builtins__", None):
        with pytest.raises(AgentError, match="y"):
            unseal._raise_from({"ok": False, "error": name, "message": "y"})
    assert unseal._error_header(ValueError("z")) == {"ok": False, "error": "AgentError", "message": "z"}


def test_helper_writes_nothing_but_frames_to_its_stdout(env) -> None:
    """A stray print in the helper would break the protocol; main() points sys.stdout at stderr."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from edgesdk.agent import unseal; print('x'); sys.exit(unseal.main())"],
        input=b"",
        capture_output=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == 0 and proc.stdout == b"x\n"  # only what came before main()
