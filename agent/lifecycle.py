"""The agent's life from start to stop: the API's sockets, the models, the parts, readiness,
signals and the drain.

``serve()`` listens first (a taken port fails at once, and ``/healthz`` answers while a large
model loads in a thread; ``/readyz`` says 503 until it is in), then loads the models, starts
the parts (governors, link, updaters, profiling) and writes ``data_dir/api.port``: the file
that says "ready". SIGTERM/SIGINT stop it; SIGHUP reloads the models. Stopping drains the
requests in flight first, then stops the parts in the reverse order and removes the files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.http import HttpLimits, HttpServer
from edgesdk.agent.fsutil import atomic_write_bytes
from edgesdk.agent.ports import RunningParts
from edgesdk.agent.systemd_notify import Watchdog, notify_ready, notify_stopping

from edgesdk._version import __version__
from edgesdk.errors import AgentError
from edgesdk.schemas.agent_config import AgentConfig

if TYPE_CHECKING:  # gRPC loads only when api.grpc.enabled
    from edgesdk.agent.api.grpc_server import GrpcServer
    from edgesdk.agent.metrics import Metrics
    from edgesdk.agent.serving import ModelServer

log = logging.getLogger("edgesdk.agent")

PORT_FILE = "api.port"
GRPC_PORT_FILE = "grpc.port"
PID_FILE = "agent.pid"


class AgentLifecycle:
    """Runs the API around the parts it is given until asked to stop."""

    def __init__(
        self,
        config: AgentConfig,
        profile_name: str,
        *,
        server: ModelServer,
        metrics: Metrics,
        status: Callable[[], dict[str, Any]],
        parts: RunningParts,
    ) -> None:
        self.config, self.profile_name = config, profile_name
        self.server, self.metrics, self.status, self.parts = server, metrics, status, parts
        self.data_dir = Path(config.data_dir)
        self.api: ApiApp | None = None
        self.http: HttpServer | None = None
        self.grpc: GrpcServer | None = None  # only when api.grpc.enabled
        self.port: int | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit code.

        The serving process is hardened first (no core file, not dumpable): it holds decrypted
        models, and a crash must not leave them on disk (:mod:`edgesdk.agent.hardening`)."""
        from edgesdk.agent.hardening import harden_process

        harden_process()
        try:
            import uvloop
        except ImportError:
            # The agent extra installs uvloop; without it (Windows, a bare install) the stdlib
            # loop serves the same API, slower per request.
            log.info("uvloop is not installed: serving on the stdlib asyncio event loop")
            return asyncio.run(self.serve())
        return uvloop.run(self.serve())

    def request_stop(self) -> None:
        """Ask a running agent to stop (thread-safe)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def serve(self) -> int:
        self._loop = loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        api, http = await self._listen()
        self.parts.guard_boot()
        await loop.run_in_executor(None, self.parts.load_installed)
        self.parts.start_governors()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, self.parts.reload))
        self.parts.start_parts()
        self._announce_ready()
        watchdog = Watchdog(self._loop_turns).start()
        await stop.wait()
        watchdog.stop()
        await self._shut_down(api, http)
        log.info("stopped")
        return 0

    async def _listen(self) -> tuple[ApiApp, HttpServer]:
        """The API on its sockets (and gRPC when enabled), before any model loads."""
        api_config = self.config.api
        self.api = api = ApiApp(self.server, self.metrics, api_config, status=self.status)
        api.loop = self._loop
        self.http = http = HttpServer(api.handle, _http_limits(api_config), count_error=self.metrics.count_error)
        self.metrics.attach_http(http)
        try:
            self.port = await http.listen_tcp(api_config.host, api_config.port)
            if api_config.unix_socket is not None:
                await http.listen_unix(str(api_config.unix_socket))
        except OSError as exc:
            raise AgentError(f"cannot listen on {api_config.host}:{api_config.port}: {exc.strerror or exc}") from exc
        self.grpc = self._start_grpc(api, http)
        if api_config.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "the inference API listens on %s, not on loopback only: anyone who can reach it can use it",
                api_config.host,
            )
        return api, http

    def _start_grpc(self, api: ApiApp, http: HttpServer) -> GrpcServer | None:
        """The gRPC endpoint when ``api.grpc.enabled`` (grpc imported only then); its port is
        written to ``data_dir/grpc.port`` before ``api.port`` says the agent is ready."""
        api_config = self.config.api
        if not api_config.grpc.enabled:
            return None
        try:
            from edgesdk.agent.api.grpc_server import GrpcServer
        except ImportError as exc:
            raise AgentError(
                f"api.grpc.enabled is set but the grpc extra is missing ({exc}); pip install 'edgesdk[grpc]'"
            ) from exc
        server = GrpcServer(
            api.scheduler,
            http.budget,
            max_message_bytes=api_config.max_body_bytes,
            max_decoded_bytes=http.limits.decoded_bytes,
        )
        port = server.start(api_config.grpc.host, api_config.grpc.port)
        atomic_write_bytes(self.data_dir / GRPC_PORT_FILE, f"{port}\n".encode(), mode=0o644)
        log.info("Open Inference Protocol over gRPC on %s:%d", api_config.grpc.host, port)
        return server

    def _announce_ready(self) -> None:
        """The port file says "ready": written once every part (link, updater) has started."""
        api_config = self.config.api
        atomic_write_bytes(self.data_dir / PORT_FILE, f"{self.port}\n".encode(), mode=0o644)
        atomic_write_bytes(self.data_dir / PID_FILE, f"{os.getpid()}\n".encode(), mode=0o644)
        where = f"http://{api_config.host}:{self.port}" + (
            f" and {api_config.unix_socket}" if api_config.unix_socket else ""
        )
        running = self.server.running_model()
        log.info(
            "edge-agent %s ready on %s (device %s, profile %s, model %s)",
            __version__,
            where,
            self.config.device_id,
            self.profile_name,
            f"{running.name} {running.version} [{running.variant}]" if running else "none",
        )
        notify_ready(f"serving {running.name} {running.version}" if running else "no model installed")

    async def _shut_down(self, api: ApiApp, http: HttpServer) -> None:
        """Drain the requests in flight, stop the parts, remove the files that said "running"."""
        api_config = self.config.api
        log.info("stopping: draining requests in flight")
        notify_stopping()
        await http.stop_listening()
        grpc_stopped = self.grpc.stop(api_config.request_timeout_s) if self.grpc is not None else None
        drained = await api.drain(api_config.request_timeout_s)
        if grpc_stopped is not None:
            await asyncio.get_running_loop().run_in_executor(None, grpc_stopped.wait, api_config.request_timeout_s)
        if not drained:
            log.warning("stopped with requests still running after %.0f s", api_config.request_timeout_s)
        http.close_idle()
        self.parts.stop_parts()
        api.close()
        for name in (PORT_FILE, GRPC_PORT_FILE, PID_FILE):
            (self.data_dir / name).unlink(missing_ok=True)
        if api_config.unix_socket is not None:
            Path(api_config.unix_socket).unlink(missing_ok=True)

    def _loop_turns(self) -> bool:
        """Watchdog health: the event loop answers within 5 s (a hung loop is a hung agent)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        loop.call_soon_threadsafe(done.set_result, True)
        try:
            return done.result(timeout=5)
        except concurrent.futures.TimeoutError:
            return False


def _http_limits(api_config: Any) -> HttpLimits:
    return HttpLimits(
        max_body_bytes=api_config.max_body_bytes,
        header_timeout_s=api_config.header_timeout_s,
        body_timeout_s=api_config.body_timeout_s,
        keepalive_timeout_s=api_config.keepalive_timeout_s,
        max_connections=api_config.max_connections,
        max_connections_per_client=api_config.max_connections_per_client,
        min_rate_bytes_s=api_config.min_rate_bytes_s,
        min_rate_grace_s=api_config.min_rate_grace_s,
        max_inflight_bytes=api_config.max_inflight_bytes,
        max_decoded_bytes=api_config.max_decoded_bytes,
    )
