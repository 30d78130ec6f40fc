"""A small keep-alive HTTP/1.1 load generator on asyncio raw streams (one process, N connections),
the same for every server compared. Records (start, end, status) per request."""

from __future__ import annotations

import asyncio
import time


async def _one_connection(host, port, request, deadline, records, errors):  # type: ignore[no-untyped-def]
    reader = writer = None
    while time.monotonic() < deadline:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            start = time.time()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            close = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                if lname == b"content-length":
                    length = int(value)
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            await reader.readexactly(length)
            records.append((start, time.time(), status))
            if close:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(type(exc).__name__)
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.01)
    if writer is not None:
        writer.close()


def run_load(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str], *, concurrency: int, seconds: float
) -> tuple[list[tuple[float, float, int]], list[str]]:
    """Drive ``concurrency`` keep-alive connections for ``seconds``; returns (records, errors)."""
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    request = head.encode() + body
    records: list[tuple[float, float, int]] = []
    errors: list[str] = []

    async def main() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            *(_one_connection(host, port, request, deadline, records, errors) for _ in range(concurrency))
        )

    asyncio.run(main())
    return records, errors


def load_in_subprocess(args: tuple, queue) -> None:  # type: ignore[no-untyped-def]
    """multiprocessing target: keeps the client off the server's GIL (and the benchmark's)."""
    queue.put(run_load(*args[:5], concurrency=args[5], seconds=args[6]))
