"""A model of TensorFlow's BFC (best-fit with coalescing) allocator, for replaying a step.

It follows `tensorflow/core/common_runtime/bfc_allocator.cc` (TF 2.21) as the CPU allocator
runs under emulation (`allow_growth`): requests round up to 256-byte granules; free chunks sit
in bins by power-of-two size (256 B << i) and a request takes the smallest free chunk that fits
(ties by address); a chunk is split only when it is at least twice the request or the rest is
at least 128 MiB — otherwise the whole chunk is handed out and counted as in use; freed chunks
merge with free neighbours of the same region; when nothing fits, a new region is added whose
size starts at 2 MiB and doubles. "In use" (what `get_memory_info` reports) sums chunk sizes.

Given `region_bytes` (an emulated card with memory growth off, see `memfit.emulate`) the
regions are the ones such a process has: the 2 MiB TensorFlow's start-up takes, and one
spanning the rest of the budget; only a request that fits in neither grows a region beyond
it (a real run would have run out of memory there; the replay goes on to say by how much).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

GRANULE = 256
BINS = 21
MAX_INTERNAL_FRAGMENTATION = 128 << 20
INITIAL_REGION = 2 << 20
_MMAP_TOP = 1 << 62
_REGION_SPACING = 1 << 48  # more than any region: regions never touch


def rounded(nbytes: int) -> int:
    """The size BFC rounds a request up to (at least one 256-byte granule)."""
    return max(GRANULE, -(-nbytes // GRANULE) * GRANULE)


def _bin(size: int) -> int:
    return min(max(size // GRANULE, 1).bit_length() - 1, BINS - 1)


@dataclass
class _Chunk:
    address: int
    size: int
    region: int
    free: bool = True
    prev: _Chunk | None = None
    next: _Chunk | None = None


class BFC:
    """Allocate and free like TensorFlow's BFC allocator; `in_use` and `peak` in bytes.

    Example:
        >>> bfc = BFC()
        >>> handle = bfc.allocate(1000)
        >>> bfc.in_use
        1024
    """

    def __init__(self, region_bytes: int | None = None) -> None:
        self.bins: list[list[tuple[int, int]]] = [[] for _ in range(BINS)]
        self.chunks: dict[int, _Chunk] = {}
        self.next_region_bytes = INITIAL_REGION
        self.regions = 0
        self.in_use = 0
        self.peak = 0
        if region_bytes is not None and region_bytes > 2 * INITIAL_REGION:
            self._extend(INITIAL_REGION)
            self._add_region(region_bytes - INITIAL_REGION)

    def _insert(self, chunk: _Chunk) -> None:
        bisect.insort(self.bins[_bin(chunk.size)], (chunk.size, chunk.address))

    def _remove(self, chunk: _Chunk) -> None:
        items = self.bins[_bin(chunk.size)]
        items.pop(bisect.bisect_left(items, (chunk.size, chunk.address)))

    def _extend(self, size: int) -> None:
        grew = False
        while size > self.next_region_bytes:
            self.next_region_bytes *= 2
            grew = True
        region_bytes = self.next_region_bytes
        if not grew:
            self.next_region_bytes *= 2
        self._add_region(region_bytes)

    def _add_region(self, region_bytes: int) -> None:
        self.regions += 1
        # Where the region lies decides ties between free chunks of one size (the lower
        # address wins). The CPU allocator's regions come from `posix_memalign`: glibc serves
        # the first (2 MiB, under its raised mmap threshold) from the heap, at the lowest
        # address, and each later one with a fresh `mmap`, placed below the one before.
        address = 0 if self.regions == 1 else _MMAP_TOP - self.regions * _REGION_SPACING
        chunk = _Chunk(address, region_bytes, self.regions)
        self.chunks[chunk.address] = chunk
        self._insert(chunk)

    def _find(self, size: int) -> _Chunk | None:
        for index in range(_bin(size), BINS):
            items = self.bins[index]
            position = bisect.bisect_left(items, (size, -1))
            if position < len(items):
                return self.chunks[items[position][1]]
        return None

    def allocate(self, nbytes: int) -> int:
        """Allocate `nbytes`; returns the chunk's address (a handle for `free`)."""
        size = rounded(nbytes)
        chunk = self._find(size)
        if chunk is None:
            self._extend(size)
            chunk = self._find(size)
            assert chunk is not None
        self._remove(chunk)
        if chunk.size >= 2 * size or chunk.size - size >= MAX_INTERNAL_FRAGMENTATION:
            rest = _Chunk(chunk.address + size, chunk.size - size, chunk.region)
            rest.prev, rest.next = chunk, chunk.next
            if chunk.next is not None:
                chunk.next.prev = rest
            chunk.next = rest
            chunk.size = size
            self.chunks[rest.address] = rest
            self._insert(rest)
        chunk.free = False
        self.in_use += chunk.size
        self.peak = max(self.peak, self.in_use)
        return chunk.address

    def size_of(self, handle: int) -> int:
        """Bytes the chunk behind `handle` counts as in use."""
        return self.chunks[handle].size

    def free(self, handle: int) -> None:
        """Free the chunk at `handle`, merging it with free neighbours."""
        chunk = self.chunks[handle]
        chunk.free = True
        self.in_use -= chunk.size
        for neighbour in (chunk.next, chunk.prev):
            if neighbour is None or not neighbour.free:
                continue
            self._remove(neighbour)
            first, second = (chunk, neighbour) if neighbour is chunk.next else (neighbour, chunk)
            first.size += second.size
            first.next = second.next
            if second.next is not None:
                second.next.prev = first
            del self.chunks[second.address]
            chunk = first
        self._insert(chunk)

    def reset_peak(self) -> None:
        """Start a new peak from what is in use now (`reset_memory_stats`)."""
        self.peak = self.in_use
