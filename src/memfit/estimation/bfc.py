"""A model of TensorFlow's BFC (best-fit with coalescing) allocator, for replaying a step.

It follows `tensorflow/core/common_runtime/bfc_allocator.cc` (TF 2.21) as the CPU allocator
runs under emulation (`allow_growth`): requests round up to 256-byte granules; free chunks sit
in bins by power-of-two size (256 B << i) and a request takes the smallest free chunk that fits
(ties by address); a chunk is split only when it is at least twice the request or the rest is
at least 128 MiB — otherwise the whole chunk is handed out and counted as in use; freed chunks
merge with free neighbours of the same region; when nothing fits, a new region is added whose
size starts at 2 MiB and doubles. "In use" (what `get_memory_info` reports) sums chunk sizes.

`raced_peak` is the highest of in use plus the `slack` live requests could add then. Ops that
run side by side race for the allocator, so a request may find a larger free chunk than the
one this order gave it and take it whole: at most one under twice the request, and at most
all the free bytes below the region's high-water mark (a chunk taken whole is a hole between
chunks in use, never the untouched rest of the region, which is split). The slack is that
largest chunk less the one the request got. Two requests, of ops on two threads, may each
win such a race: VGG16's Adam update (96 px, batch 2, two inter-op threads) updates its two
largest variables side by side, and in profiled processes both copies of the variables
(72 and 64 MiB) got chunks of 113 and 117 MiB whole. So the slack added is that of the two
live requests with the most, together at most the free bytes the later of the two found
below the high-water mark, less its own chunk (or the largest one slack, where that is more).

Given `region_bytes` (an emulated card with memory growth off, see `memfit.emulate`) the
regions are the ones such a process has: the 2 MiB TensorFlow's start-up takes, and one
spanning the rest of the budget; only a request that fits in neither grows a region beyond
it (a real run would have run out of memory there; the replay goes on to say by how much).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

GRANULE = 256
BINS = 21
MAX_INTERNAL_FRAGMENTATION = 128 << 20
INITIAL_REGION = 2 << 20
_MMAP_TOP = 1 << 62
_REGION_SPACING = 1 << 48  # more than any region: regions never touch


def round_up(nbytes: int) -> int:
    """Bytes the BFC allocator hands out for a request of `nbytes` (256-byte granules; a
    request of nothing takes nothing)."""
    return 0 if nbytes <= 0 else -(-nbytes // GRANULE) * GRANULE


def rounded(nbytes: int) -> int:
    """The size BFC rounds a request up to (at least one 256-byte granule)."""
    return max(GRANULE, -(-nbytes // GRANULE) * GRANULE)


def _bin(size: int) -> int:
    """The bin of chunks of `size` bytes: `log2(size / 256)`, rounded down, at most the last."""
    index = (max(size, GRANULE) // GRANULE).bit_length() - 1
    return index if index < BINS else BINS - 1


@dataclass(slots=True)
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
        self.raced_peak = 0
        # Per region: its first address, its high-water mark (end of the highest chunk ever
        # handed out) and its bytes in use; live chunks' slack and a max-heap over it.
        self.base: dict[int, int] = {}
        self.top: dict[int, int] = {}
        self.used: dict[int, int] = {}
        self.slack: dict[int, int] = {}
        # Live chunks with slack: (request number, free bytes below the top it found beyond it).
        self.room: dict[int, tuple[int, int]] = {}
        self.requests = 0
        self._slack_heap: list[tuple[int, int]] = []
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
        self.base[self.regions] = self.top[self.regions] = address
        self.used[self.regions] = 0
        self.chunks[chunk.address] = chunk
        self._insert(chunk)

    def _find(self, size: int) -> _Chunk | None:
        for index in range(_bin(size), BINS):
            items = self.bins[index]
            if not items:
                continue
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
        region = chunk.region
        below_top = self.top[region] - self.base[region] - self.used[region]
        whole = min(2 * size - GRANULE, size + MAX_INTERNAL_FRAGMENTATION - GRANULE, below_top)
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
        self.used[region] += chunk.size
        self.top[region] = max(self.top[region], chunk.address + chunk.size)
        if whole > chunk.size:
            self.slack[chunk.address] = whole - chunk.size
            self.room[chunk.address] = (self.requests, below_top - chunk.size)
            heapq.heappush(self._slack_heap, (chunk.size - whole, chunk.address))
        self.requests += 1
        if self.in_use + self._slack_bound() > self.raced_peak:
            self.raced_peak = max(self.raced_peak, self.in_use + self._raced_slack())
        return chunk.address

    def _slack_bound(self) -> int:
        """At least `_raced_slack()`, read off the slack heap's two largest entries.

        The heap holds every live request's slack (and, until `_raced_slack` drops them,
        those of freed ones), so its two largest entries sum to at least the two largest
        live slacks: where even that cannot raise `raced_peak`, an allocation need not
        work the slack out.
        """
        heap = self._slack_heap
        if not heap:
            return 0
        second = -min(heap[1:3])[0] if len(heap) > 1 else 0
        return -heap[0][0] + second

    def _raced_slack(self) -> int:
        """The most one live request, or two raced side by side, could hold more (see above)."""
        heap, slack = self._slack_heap, self.slack
        taken: list[tuple[int, int]] = []
        while heap and len(taken) < 2:
            entry = heapq.heappop(heap)
            if slack.get(entry[1]) == -entry[0] and entry not in taken:
                taken.append(entry)
        for entry in taken:
            heapq.heappush(heap, entry)
        if len(taken) < 2:
            return -taken[0][0] if taken else 0
        largest, second = -taken[0][0], -taken[1][0]
        later = max(self.room[address] for _, address in taken)[1]
        return min(largest + second, max(largest, later))

    def size_of(self, handle: int) -> int:
        """Bytes the chunk behind `handle` counts as in use."""
        return self.chunks[handle].size

    def free(self, handle: int) -> None:
        """Free the chunk at `handle`, merging it with free neighbours."""
        chunk = self.chunks[handle]
        chunk.free = True
        self.in_use -= chunk.size
        self.used[chunk.region] -= chunk.size
        self.slack.pop(handle, None)
        self.room.pop(handle, None)
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
        self.raced_peak = self.in_use + self._raced_slack()
