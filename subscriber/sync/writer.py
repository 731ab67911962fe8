"""BatchWriter: small resource bodies written to the folder by a worker thread, many per hand-off.

A baseline writes thousands of small files. One `asyncio.to_thread` per file costs two thread
wake-ups and a loop wake-up each, which on a busy machine took longer than the write itself;
here the files that queue up while the thread writes go to it together, so a batch costs one
hand-off and one wake-up of the loop, whatever its size. Each caller still learns its own file's
outcome (a PathConflictError stays that file's alone).
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from .sink import FolderSink

MAX_BATCH = 256           # files handed to the thread at once


class BatchWriter:
    """`await write(path, body)`: FolderSink.write_small in a worker thread, batched."""

    def __init__(self, sink: FolderSink) -> None:
        self.sink = sink
        self._queue: list[tuple[Path | str, bytes, asyncio.Future[None]]] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None
        self.batches = 0          # hand-offs to the thread so far (for tests and the curious)

    async def write(self, path: Path | str, body: bytes) -> None:
        """Write `body` to `path` (temp file + rename, as write_small does); its errors raise here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append((path, body, future))
        if not self._draining:
            self._draining = True
            self._task = loop.create_task(self._drain())
        await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self.batches += 1
                try:
                    errors = await asyncio.to_thread(self._write_all, [(path, body) for path, body, _ in batch])
                except BaseException as exc:   # the hand-off itself failed (e.g. cancelled): every caller hears
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    raise
                for (_, _, future), error in zip(batch, errors, strict=True):
                    if future.done():          # its caller was cancelled meanwhile
                        continue
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
        finally:
            self._draining = False

    def _write_all(self, files: list[tuple[Path | str, bytes]]) -> list[Exception | None]:
        errors: list[Exception | None] = []
        for path, body in files:
            try:
                self.sink.write_small(path, body)
            except Exception as exc:  # noqa: BLE001 - handed to that file's caller, which decides
                errors.append(exc)
            else:
                errors.append(None)
        return errors
