"""Open installed bundles in a short-lived helper process, so the daemon never loads the crypto.

Verifying a bundle and decrypting its variants needs the ``cryptography`` package (a Rust
extension that carries its own OpenSSL) and the device's private key, but only while a bundle
is opened: at start and on reload. Done in the daemon, both stay in its memory for the rest of
its life: ~10 MB of a board's RAM (``benchmarks/bench_start_costs.py --memory``), and the device
key sits in the process that parses every HTTP request and MQTT message. So the daemon runs
``python -m edgesdk.agent.unseal`` for as long as it opens bundles. The helper makes the very
same checks as opening in process (``verify_installed_bundle`` / ``verify_bundle``, then
``decrypt_variant``: every GCM tag and the signed plaintext SHA-256), answers with the manifest
and the plaintext over a pipe (memory only, never a file), and exits when the daemon closes it.
The daemon validates the manifest itself and re-hashes each variant's plaintext against it
before any runtime sees a byte, so a framing fault on the pipe cannot load the wrong bytes.

Protocol, both ways: frames of a 4-byte big-endian length, a JSON header of that length, then
the raw bytes of each part listed in ``header["parts"]`` (their sizes). The daemon sends ``open`` (a bundle
path and what to check it against) and ``decrypt`` (a variant id); every answer has ``ok``, and
a failure names the ``edgesdk.errors`` class to raise, so fallback works as in process.

Updates over the air and sideloads use it too (:mod:`edgesdk.agent.openers`): ``open`` then also
carries the release floor (``installed_release``), ``golden`` returns the smoke test's arrays, and
``public_key`` derives the device's public key for a device key that has no ``.pub`` file beside
it. So with ``unseal = "helper"`` the device's private key is only ever read by a helper, never by
the daemon (``docs/agent.md``, "Which process holds the device key").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from edgesdk import errors
from edgesdk.errors import AgentError, EdgeSDKError, IntegrityError

log = logging.getLogger("edgesdk.agent.unseal")

_LENGTH = struct.Struct(">I")
_MAX_HEADER = 16 * 1024 * 1024  # a manifest is KBs; anything near this is a broken stream


# -- framing --------------------------------------------------------------------------------------


def _send(stream: IO[bytes], header: dict[str, Any], payload: Sequence[bytes | memoryview] = ()) -> None:
    header = {**header, "parts": [len(part) for part in payload]} if payload else header
    raw = json.dumps(header, separators=(",", ":")).encode()
    stream.write(_LENGTH.pack(len(raw)) + raw)
    for part in payload:
        stream.write(part)
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError(f"stream ended after {0 if data is None else len(data)} of {size} bytes")
    return data


def _receive(stream: IO[bytes]) -> tuple[dict[str, Any], list[bytes]]:
    """One frame: its header, and its payload as parts (one per entry of ``header["parts"]``,
    the sizes in order). Parts are read one by one into their own ``bytes``, so a variant's
    files reach the runtime without a copy of the whole plaintext beside them."""
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size))
    if length > _MAX_HEADER:
        raise EOFError(f"frame header of {length} bytes")
    try:
        header = json.loads(_read_exactly(stream, length))
    except ValueError as exc:
        raise EOFError(f"frame header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise EOFError("frame header is not an object")
    sizes = header.get("parts") or []
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise EOFError(f"frame header has bad part sizes {sizes!r}")
    return header, [_read_exactly(stream, n) if n else b"" for n in sizes]


def _error_header(exc: BaseException) -> dict[str, Any]:
    kind = type(exc).__name__ if isinstance(exc, EdgeSDKError) else "AgentError"
    return {"ok": False, "error": kind, "message": str(exc) or type(exc).__name__}


def _raise_from(header: dict[str, Any]) -> None:
    kind = getattr(errors, str(header.get("error")), None)
    if not (isinstance(kind, type) and issubclass(kind, EdgeSDKError)):
        kind = AgentError
    raise kind(str(header.get("message", "the unseal helper failed")))


# -- the daemon's side ---------------------------------------------------------------------------


class OpenedBundle:
    """What the helper verified, as the daemon holds it: the same fields as ``VerifiedBundle``.

    Made only by :meth:`Unsealer.verify` / :meth:`Unsealer.verify_installed`, from the helper's answer; the manifest is validated
    here again with the schema. Decrypting goes back through the helper that opened it."""

    __slots__ = ("front_sha256", "manifest", "path", "payloads_hashed", "publisher_key_id", "sha256", "size")

    def __init__(self, path: Path, answer: dict[str, Any], manifest_bytes: bytes) -> None:
        from edgesdk.schemas.manifest import BundleManifest

        self.path = path
        self.manifest = BundleManifest.parse_json_clear(manifest_bytes, source=f"{path}: manifest")
        self.sha256: str = answer["sha256"]
        self.front_sha256: str = answer["front_sha256"]
        self.size: int = answer["bundle_size"]
        self.publisher_key_id: str = answer["publisher_key_id"]
        self.payloads_hashed: bool = answer["payloads_hashed"]

    def __repr__(self) -> str:
        m = self.manifest.model
        return f"<OpenedBundle {m.name} {m.version} release {m.release} from {self.path}>"


class Unsealer:
    """The daemon's handle on one helper process; a context manager (the helper exits on close).

    ``verify`` and ``verify_installed`` take the keyword arguments of ``verify_bundle`` and
    ``verify_installed_bundle`` (so :class:`~edgesdk.agent.slot_store.SlotStore` can use them as
    they are) except that keys are files: the helper reads ``publisher_keys`` and
    ``device_key`` itself. ``decrypt(bundle, variant_id, _key)`` fits ``ModelServer.swap``."""

    def __init__(
        self,
        *,
        publisher_keys: Sequence[Path],
        device_key: Path,
        trust_document: Path | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.publisher_keys = [str(p) for p in publisher_keys]
        # With a trust document the helper checks it and takes ITS publisher keys (not the list).
        self.trust_document = str(trust_document) if trust_document is not None else None
        self.device_key = str(device_key)
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._opens: dict[str, dict[str, Any]] = {}  # path → its open request, replayed in a new helper
        self._opened_in: dict[str, subprocess.Popen[bytes]] = {}  # path → the helper that opened it

    def __enter__(self) -> Unsealer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the helper now; AgentError when it cannot be (the caller may open in process)."""
        self._process()

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "edgesdk.agent.unseal"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    close_fds=True,
                    # "-m" puts the working directory first on sys.path: run from "/" so that
                    # a source checkout there (an "edgesdk/" folder) cannot shadow the
                    # installed package the daemon itself runs.
                    cwd=os.path.abspath(os.sep),
                    # Its logging and any traceback go where the daemon's go (the journal).
                )
            except OSError as exc:
                raise AgentError(f"cannot start the unseal helper ({sys.executable}): {exc}") from exc
        return self._proc

    def _ask(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        proc = self._process()
        assert proc.stdin is not None and proc.stdout is not None
        # A helper that hangs must not hang the daemon's start: killed, it reads as an error.
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(self.timeout_s, kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            _send(proc.stdin, request)
            answer, parts = _receive(proc.stdout)
        except (OSError, EOFError, ValueError) as exc:
            try:
                code: int | None = proc.wait(timeout=2)  # the pipe closes just before it is reaped
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            if timed_out.is_set():
                ended = f"did not answer within {self.timeout_s:g} s and was killed"
            else:
                ended = f"exited with {code}" if code is not None else "broke the protocol"
            raise AgentError(f"the unseal helper {ended} during {request['op']}: {exc}") from exc
        finally:
            watchdog.cancel()
        if not answer.get("ok"):
            _raise_from(answer)
        return answer, parts

    def verify_installed(
        self,
        path: Path,
        *,
        trusted_publishers: Any = None,
        installed_front_sha256: str,
        installed_sha256: str,
        profile: str | None = None,
    ) -> OpenedBundle:
        return self._open(
            path,
            installed={"front_sha256": installed_front_sha256, "sha256": installed_sha256},
            profile=profile,
        )

    def verify(
        self,
        path: Path,
        *,
        trusted_publishers: Any = None,
        profile: str | None = None,
        allow_expired: bool = False,
        installed_release: int | None = None,
        rollback_floor: int | None = None,
    ) -> OpenedBundle:
        return self._open(
            path,
            installed=None,
            profile=profile,
            allow_expired=allow_expired,
            installed_release=installed_release,
            rollback_floor=rollback_floor,
        )

    def _open(
        self,
        path: Path,
        *,
        installed: dict[str, str] | None,
        profile: str | None,
        allow_expired: bool = True,
        installed_release: int | None = None,
        rollback_floor: int | None = None,
    ) -> OpenedBundle:
        path = Path(path).absolute()
        request = {
            "op": "open",
            "path": str(path),
            "publisher_keys": self.publisher_keys,
            "trust_document": self.trust_document,
            "profile": getattr(profile, "name", profile),
            "installed": installed,
            "allow_expired": allow_expired,
            "installed_release": installed_release,
            "rollback_floor": rollback_floor,
        }
        answer, parts = self._ask(request)
        if len(parts) != 1:
            raise AgentError(f"the unseal helper answered open with {len(parts)} parts, not the manifest")
        opened = OpenedBundle(path, answer, parts[0])
        self._opens[str(path)] = request
        self._opened_in[str(path)] = self._process()
        return opened

    def decrypt(self, bundle: OpenedBundle, variant_id: str, _device_key: Any = None) -> dict[str, bytes]:
        """The variant's files (name → plaintext), checked against ``bundle``'s manifest here too."""
        try:
            variant = bundle.manifest.variant(variant_id)
        except KeyError:
            raise AgentError(f"bundle has no variant {variant_id!r}") from None
        path = str(bundle.path)
        if self._opened_in.get(path) is not self._proc and path in self._opens:
            # The helper that opened it died (reported as that variant's problem): the next
            # variant is decrypted by a new helper, which must open the bundle first.
            answer, _ = self._ask(self._opens[path])
            if answer["front_sha256"] != bundle.front_sha256:
                raise IntegrityError(f"{path}: the bundle changed while it was being loaded")
            self._opened_in[path] = self._process()
        _, contents = self._ask({"op": "decrypt", "path": path, "variant": variant_id, "device_key": self.device_key})
        # The signed hash is over the files in order; their signed sizes say where each starts.
        digest = hashlib.sha256()
        for content in contents:
            digest.update(content)
        sizes = [entry.size for entry in variant.files]
        if [len(c) for c in contents] != sizes or digest.hexdigest() != variant.sha256:
            raise IntegrityError(
                f"{bundle.path}: variant {variant_id}: plaintext from the helper is not the signed one"
            )
        return {entry.name: content for entry, content in zip(variant.files, contents, strict=True)}

    def golden(self, bundle: OpenedBundle) -> dict[str, Any] | None:
        """The bundle's golden inputs/outputs (name → numpy array), or None if it has none."""
        import numpy as np

        if bundle.manifest.golden is None:
            return None
        if self._opened_in.get(str(bundle.path)) is not self._proc:
            raise AgentError(f"{bundle.path}: the unseal helper that opened it is gone; open it again")
        answer, parts = self._ask({"op": "golden", "path": str(bundle.path), "device_key": self.device_key})
        arrays = answer.get("arrays")
        if not isinstance(arrays, list) or len(arrays) != len(parts):
            raise AgentError(f"the unseal helper answered golden with {len(parts)} parts for {arrays!r}")
        golden: dict[str, Any] = {}
        for meta, raw in zip(arrays, parts, strict=True):
            dtype = np.dtype(str(meta["dtype"]))
            if dtype.hasobject:  # never unpickle: object arrays are refused as np.load refuses them
                raise IntegrityError(f"{bundle.path}: golden array {meta['name']!r} has object dtype {dtype}")
            golden[str(meta["name"])] = np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in meta["shape"]])
        return golden

    def public_key(self) -> bytes:
        """The raw 32-byte public half of the device key, derived in the helper."""
        answer, parts = self._ask({"op": "public_key", "device_key": self.device_key})
        if len(parts) != 1 or len(parts[0]) != 32:
            raise AgentError("the unseal helper answered public_key without a 32-byte key")
        return parts[0]

    def state_key(self) -> bytes:
        """The key that authenticates the security state record, derived from the device key in
        the helper (:func:`edgesdk.agent.security_state.derive_state_key`): the daemon gets the
        derived key, never the device key."""
        answer, parts = self._ask({"op": "state_key", "device_key": self.device_key})
        if len(parts) != 1 or len(parts[0]) != 32:
            raise AgentError("the unseal helper answered state_key without a 32-byte key")
        return parts[0]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


# -- the helper's side ---------------------------------------------------------------------------


class _Helper:
    def __init__(self) -> None:
        self.opened: dict[str, Any] = {}  # path → VerifiedBundle

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        op = request.get("op")
        if op == "open":
            return self.open(request)
        if op == "decrypt":
            return self.decrypt(request)
        if op == "golden":
            return self.golden(request)
        if op == "state_key":
            return self.state_key(request)
        if op == "public_key":
            return self.public_key(request)
        raise AgentError(f"unknown request {op!r}")

    def open(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        import edgesdk.bundle as bundle

        path = Path(request["path"])
        publishers: list[Any] = list(request.get("publisher_keys") or [])
        if request.get("trust_document"):
            from edgesdk.trust import load_document, role_keys, verify_self

            document = load_document(request["trust_document"])
            verify_self(document)  # a threshold of its own root: a damaged or edited file is refused
            publishers = role_keys(document.roles.publisher)
        installed = request.get("installed")
        if installed:
            verified = bundle.verify_installed_bundle(  # type: ignore[attr-defined]
                path,
                trusted_publishers=publishers,
                profile=request.get("profile"),
                installed_front_sha256=installed["front_sha256"],
                installed_sha256=installed["sha256"],
            )
        else:
            verified = bundle.verify_bundle(  # type: ignore[attr-defined]
                path,
                trusted_publishers=publishers,
                profile=request.get("profile"),
                allow_expired=bool(request.get("allow_expired")),
                installed_release=request.get("installed_release"),
                rollback_floor=request.get("rollback_floor"),
            )
        self.opened[str(path)] = verified
        manifest = verified.manifest.model_dump_json().encode()
        answer = {
            "ok": True,
            "sha256": verified.sha256,
            "front_sha256": verified.front_sha256,
            "bundle_size": verified.size,
            "publisher_key_id": verified.publisher_key_id,
            "payloads_hashed": verified.payloads_hashed,
        }
        return answer, [manifest]

    def decrypt(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        import edgesdk.bundle as bundle
        from edgesdk.keys import load_device_private_key

        verified = self.opened.get(str(request.get("path")))
        if verified is None:
            raise AgentError(f"bundle {request.get('path')!r} was not opened first")
        key = load_device_private_key(request["device_key"])
        files = bundle.decrypt_variant(verified, str(request["variant"]), key)  # type: ignore[attr-defined]
        parts: list[bytes | memoryview] = list(files.values())  # in the manifest's file order
        return {"ok": True}, parts

    def golden(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        import edgesdk.bundle as bundle
        from edgesdk.keys import load_device_private_key

        verified = self.opened.get(str(request.get("path")))
        if verified is None:
            raise AgentError(f"bundle {request.get('path')!r} was not opened first")
        key = load_device_private_key(request["device_key"])
        arrays = bundle.decrypt_golden(verified, key) or {}  # type: ignore[attr-defined]
        meta = [{"name": name, "dtype": a.dtype.str, "shape": list(a.shape)} for name, a in arrays.items()]
        return {"ok": True, "arrays": meta}, [a.tobytes() for a in arrays.values()]

    def public_key(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        from edgesdk.keys import load_device_private_key

        key = load_device_private_key(request["device_key"])
        return {"ok": True}, [key.public_key().public_bytes_raw()]

    def state_key(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | memoryview]]:
        from edgesdk.agent.security_state import derive_state_key

        from edgesdk.keys import load_device_private_key

        return {"ok": True}, [derive_state_key(load_device_private_key(request["device_key"]).private_bytes_raw())]


def main() -> int:
    """The helper: answer requests on stdin until it closes. Never writes plaintext to a file."""
    from edgesdk.agent.hardening import harden_process

    from edgesdk.offline import disable_vendor_telemetry

    harden_process()  # it holds the device key and plaintext: no core dump, no ptrace by peers
    disable_vendor_telemetry()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the pipe
    helper = _Helper()
    while True:
        try:
            request, _ = _receive(stdin)
        except EOFError:
            return 0
        try:
            answer, payload = helper.handle(request)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer; the daemon decides
            answer, payload = _error_header(exc), []
        _send(stdout, answer, payload)


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
