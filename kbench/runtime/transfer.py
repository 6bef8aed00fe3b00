"""Staged host<->device transfers: parallel host copies, and chunks that overlap them with the DMA.

A staged upload is two copies in series: the host copies the array into mapped staging memory,
then the GPU copies staging into device memory (a download is the reverse). One host thread
copies at about 10 GB/s, so done in series the two copies ran at 8 GB/s end to end on an H200
whose DMA alone moves 51 GB/s. Here large transfers are cut into chunks, one VkEvent each: an
upload's chunks are copied by a pool of threads (NumPy releases the GIL while it copies) and
each chunk's event is set from the host as it lands, while the GPU, already submitted, waits on
each event and copies that chunk; a download's GPU copies set their chunk's event and the host
copies each chunk out as soon as it is set, while the GPU copies the next.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import _vk
from ._vk import ffi, lib, vk

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager
    from .recorder import Recorder
    from .sequence import Sequence

#: host copies smaller than this run on the calling thread (thread hand-off costs ~10 us)
PARALLEL_MIN_BYTES = 4 << 20
#: smallest piece a parallel host copy hands to one thread
PIECE_BYTES = 4 << 20

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_threads() -> int:
    """Threads used for large host copies: KBENCH_COPY_THREADS, else min(16, CPUs). One thread
    copies about 10 GB/s on the H200's host; 16 reach 46-52 GB/s, the DMA's rate."""
    env = os.environ.get("KBENCH_COPY_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(16, os.cpu_count() or 1))


def _executor() -> ThreadPoolExecutor:
    """The copy threads. Their tasks only copy memory and set events, never wait for the GPU
    (which may be waiting for them): a download's caller polls the events and hands over chunks
    that are ready."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(copy_threads(), thread_name_prefix="kbench-copy")
        return _pool


def mapped_bytes(ptr, nbytes: int) -> np.ndarray:
    """A uint8 NumPy view of ``nbytes`` of mapped memory at ``ptr`` (no copy)."""
    return np.frombuffer(ffi.buffer(ptr, nbytes), dtype=np.uint8)


def as_bytes(data) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array or buffer (no copy)."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def host_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for flat uint8 arrays, split over the copy threads when large."""
    n = src.size
    if dst.size != n:
        raise ValueError(f"host_copy: destination has {dst.size} bytes, source {n}")
    threads = copy_threads()
    if n < PARALLEL_MIN_BYTES or threads == 1:
        np.copyto(dst, src)
        return
    step = max(PIECE_BYTES, -(-n // threads))
    futures = [_executor().submit(np.copyto, dst[o:o + step], src[o:o + step]) for o in range(0, n, step)]
    for f in futures:
        f.result()


class Chunk:
    """One piece of a staged transfer: ``size`` bytes at ``host_offset`` of host array ``host``
    (an index into the op's host arrays), ``staging_offset`` in staging and ``device_offset`` in
    the tensor ``buffer``."""

    __slots__ = ("host", "host_offset", "staging_offset", "buffer", "device_offset", "size")

    def __init__(self, host: int, host_offset: int, staging_offset: int, buffer, device_offset: int, size: int):
        self.host, self.host_offset, self.staging_offset = host, host_offset, staging_offset
        self.buffer, self.device_offset, self.size = buffer, device_offset, size


#: streamed chunks start on this staging boundary. On the H200 (driver 580) an upload chunk that
#: shared a few hundred bytes of staging with the chunk before it was copied stale: the GPU had
#: read those bytes (with the earlier chunk, before the host wrote them) and the event wait did
#: not make the host's later writes visible. 4 KiB apart, 300 of 300 round trips came back exact.
CHUNK_ALIGN = 4096


def plan_chunks(ranges: list[tuple[object, int, int]], chunk_bytes: int, align: int = 1) -> list[Chunk]:
    """Chunks for ``ranges`` of (tensor, byte offset in it, bytes) in staging, each range
    starting at a multiple of ``align``; range i is host array i."""
    out, staged = [], 0
    for i, (buf, dev_off, nbytes) in enumerate(ranges):
        staged = -(-staged // align) * align
        for o in range(0, nbytes, chunk_bytes):
            size = min(chunk_bytes, nbytes - o)
            out.append(Chunk(i, o, staged + o, buf, dev_off + o, size))
        staged += nbytes
    return out


class StagedTransfer:
    """The recorded half of a staged copy in one direction ("up": host to device, "down": device
    to host) of several byte ranges through one staging buffer.

    Recorded whole when small (the host copies before submission or after the wait), or as
    streamed chunks synchronised by VkEvents when at least ``Manager.stream_min_bytes``.
    """

    def __init__(self, mgr: "Manager", direction: str, ranges: list[tuple[object, int, int]]):
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        self.mgr = mgr
        self.direction = direction
        total = sum(n for _, _, n in ranges)
        self.streamed = mgr._can_stream(direction) and total >= mgr.stream_min_bytes
        if self.streamed:
            self.chunks = plan_chunks(ranges, mgr.transfer_chunk_bytes, CHUNK_ALIGN)
        else:
            self.chunks = plan_chunks(ranges, max(1, total))
        #: staging bytes needed (with the alignment gaps between streamed ranges)
        self.total = max((c.staging_offset + c.size for c in self.chunks), default=0)
        self._events: list = []
        self._done: list[bool] = []
        self._event_array = None

    # --- recording -----------------------------------------------------------------------------
    def record(self, rec: "Recorder", staging) -> None:
        """Record the GPU copies (and, when streamed, the event waits or signals)."""
        if not self.streamed:
            for c in self.chunks:
                self._copy(rec, staging, c)
            return
        self._make_events(len(self.chunks))
        if self.direction == "up":
            mb = ffi.new("VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                              "srcAccessMask": vk.VK_ACCESS_HOST_WRITE_BIT,
                                              "dstAccessMask": vk.VK_ACCESS_TRANSFER_READ_BIT})
            for i, c in enumerate(self.chunks):
                # host-set events: the wait's source stage is HOST, and the barrier makes the
                # host's writes to the (coherent) staging memory visible to the copy
                rec.wait_host_event(self._event_array, i, mb)
                self._copy(rec, staging, c)
        else:
            mb = ffi.new("VkMemoryBarrier2*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER_2,
                                               "srcStageMask": vk.VK_PIPELINE_STAGE_2_TRANSFER_BIT,
                                               "srcAccessMask": vk.VK_ACCESS_2_TRANSFER_WRITE_BIT,
                                               "dstStageMask": vk.VK_PIPELINE_STAGE_2_HOST_BIT,
                                               "dstAccessMask": vk.VK_ACCESS_2_HOST_READ_BIT})
            dep = ffi.new("VkDependencyInfo*", {"sType": vk.VK_STRUCTURE_TYPE_DEPENDENCY_INFO,
                                                "memoryBarrierCount": 1, "pMemoryBarriers": mb})
            for i, c in enumerate(self.chunks):
                self._copy(rec, staging, c)
                # the signal carries the copy's writes to the host: once the host sees the
                # event set, this chunk of staging holds the data
                rec.set_event(self._events[i], dep)

    def _copy(self, rec: "Recorder", staging, c: Chunk) -> None:
        if self.direction == "up":
            c.buffer.record_copy_from(rec, staging, c.size, c.staging_offset, c.device_offset)
        else:
            c.buffer.record_copy_to(rec, staging, c.size, c.device_offset, c.staging_offset)

    # --- host side, around one submission --------------------------------------------------------
    def before_submit(self, staging, hosts: list[np.ndarray]) -> None:
        """Upload: copy everything now unless streamed. Streamed: reset the events."""
        if self.streamed:
            self._done = [False] * len(self.chunks)
            dev = self.mgr._device
            for ev in self._events:
                _vk.check(lib.vkResetEvent(dev, ev), "vkResetEvent")
        elif self.direction == "up":
            for c in self.chunks:
                host_copy(self._staging_view(staging, c), hosts[c.host][c.host_offset:c.host_offset + c.size])

    def after_submit(self, staging, hosts: list[np.ndarray]) -> None:
        """Streamed upload: the copy threads fill staging a chunk each and set that chunk's event
        as it lands. Every event is set even when a copy fails, so the GPU never waits forever."""
        if not (self.streamed and self.direction == "up"):
            return
        dev = self.mgr._device

        def one(i: int, c: Chunk) -> None:
            try:
                np.copyto(self._staging_view(staging, c), hosts[c.host][c.host_offset:c.host_offset + c.size])
            finally:
                lib.vkSetEvent(dev, self._events[i])

        ex = _executor()
        futures = []
        try:
            futures = [ex.submit(one, i, c) for i, c in enumerate(self.chunks)]
        finally:
            for f in futures:
                f.exception()  # every copy finished before anything is raised
            for ev in self._events:  # no-op where set; releases the GPU if submitting failed midway
                lib.vkSetEvent(dev, ev)
        for f in futures:
            f.result()

    def while_waiting(self, staging, hosts: list[np.ndarray], fence_done: Callable[[], bool]) -> None:
        """Streamed download: this thread polls the chunks' events in order and hands each chunk
        to the copy threads as soon as it is set, while the GPU copies the next ones. The copy
        threads never wait for the GPU."""
        if not (self.streamed and self.direction == "down"):
            return
        dev = self.mgr._device
        ex = _executor()
        futures = []
        try:
            for i, c in enumerate(self.chunks):
                polls = 0
                while True:
                    res = lib.vkGetEventStatus(dev, self._events[i])
                    if res == vk.VK_EVENT_SET:
                        break
                    if res != vk.VK_EVENT_RESET:
                        self.mgr._result(res, "vkGetEventStatus")
                    polls += 1
                    if polls % 256 == 0 and fence_done():
                        return  # finished (or failed) without the signal: after_wait copies the rest
                futures.append(ex.submit(self._copy_out, staging, hosts, i, c))
        finally:
            for f in futures:
                f.exception()
        for f in futures:
            f.result()

    def _copy_out(self, staging, hosts: list[np.ndarray], i: int, c: Chunk) -> None:
        np.copyto(hosts[c.host][c.host_offset:c.host_offset + c.size], self._staging_view(staging, c))
        self._done[i] = True

    def after_wait(self, staging, hosts: list[np.ndarray]) -> None:
        """Download: copy out whatever ``while_waiting`` did not."""
        if self.direction != "down":
            return
        for i, c in enumerate(self.chunks):
            if not (self.streamed and self._done[i]):
                host_copy(hosts[c.host][c.host_offset:c.host_offset + c.size], self._staging_view(staging, c))

    @staticmethod
    def _staging_view(staging, c: Chunk) -> np.ndarray:
        return mapped_bytes(staging.ptr + c.staging_offset, c.size)

    # --- lifetime --------------------------------------------------------------------------------
    def _make_events(self, count: int) -> None:
        if len(self._events) == count:
            return
        self.destroy()
        dev = self.mgr._device
        for _ in range(count):
            with _vk.call("vkCreateEvent"):
                self._events.append(vk.vkCreateEvent(dev, vk.VkEventCreateInfo(), None))
        self._event_array = ffi.new("VkEvent[]", self._events)
        self.mgr._stats["events"] += count

    def destroy(self) -> None:
        """Free the events (the sequence holding this transfer must not be running)."""
        if self._events and self.mgr._device is not None:
            for ev in self._events:
                vk.vkDestroyEvent(self.mgr._device, ev, None)
            self.mgr._stats["events"] -= len(self._events)
        self._events = []
        self._event_array = None


def round_trip_errors(up: "Sequence", down: "Sequence", tensors: list, data: list[np.ndarray]) -> list[str]:
    """Self-check of a transfer path: put ``data`` in the tensors' host side, evaluate the recorded
    upload ``up``, overwrite the host side, evaluate the download ``down``; one line per tensor
    whose data came back different (empty: exact)."""
    for t, d in zip(tensors, data):
        t.data()[:] = d
    up.eval()
    for t in tensors:
        t.data().view(np.uint8)[:] = 0xFF  # NaN for floats: a stale value cannot pass
    down.eval()
    errors = []
    for i, (t, d) in enumerate(zip(tensors, data)):
        got = t.data()
        wrong = np.flatnonzero(got.view(np.uint8) != d.reshape(-1).view(np.uint8))
        if wrong.size:
            b = int(wrong[0])
            errors.append(f"tensor {i}: {wrong.size} bytes differ, first at byte {b} "
                          f"(got {got.view(np.uint8)[b]:#04x}, want {d.reshape(-1).view(np.uint8)[b]:#04x})")
    return errors
