"""Models of the framework allocator: what it counts for each allocation.

TensorFlow's statistics (``get_memory_info``) count the chunks its BFC
allocator hands out, not the bytes requested. :class:`BFCModel` follows the
algorithm of ``tensorflow/core/common_runtime/bfc_allocator.cc``:

* requests are rounded up to 256 bytes;
* free chunks sit in 21 bins by size (256 B << bin); a request takes the
  smallest free chunk that fits, searching from its own bin upward;
* a chunk is split only when it is at least twice the request (or the rest is
  at least 128 MiB): otherwise the whole chunk counts as in use;
* when nothing fits, the allocator grows by a new region of
  ``max(request, current region size)`` bytes, the region size doubling from
  2 MiB after each growth;
* each new region lies below the earlier ones: the operating system maps
  each new block of memory below the last, and among free chunks of one
  size the allocator takes the lowest address, so the newest region's.
  Replayed with regions placed upward instead, a recorded process's counts
  part from TensorFlow's at the first tie between regions (by up to 47 MiB
  for MobileNetV2; ``benchmarks/allocator_replay.py``);
* a freed chunk merges with free neighbours in its region.

:class:`ExactModel` counts requests rounded to 256 bytes, with no
fragmentation.
"""

from __future__ import annotations

import bisect
import dataclasses

GRANULE = 256
_NUM_BINS = 21
_MAX_INTERNAL_FRAGMENTATION = 128 << 20
_INITIAL_REGION = 2 << 20


def rounded(n: int) -> int:
    return max(GRANULE, -(-n // GRANULE) * GRANULE) if n > 0 else 0


class ExactModel:
    """Counts each request rounded up to the allocator granule."""

    name = "exact"

    def __init__(self) -> None:
        self.in_use = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        self._next = 0

    def alloc(self, nbytes: int) -> tuple[int, int]:
        size = rounded(nbytes)
        handle = self._next
        self._next += 1
        self._sizes[handle] = size
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return handle, size

    def free(self, handle: int) -> None:
        self.in_use -= self._sizes.pop(handle)

    def reset_peak(self) -> None:
        self.peak = self.in_use


@dataclasses.dataclass
class _Chunk:
    addr: int
    size: int
    region: int
    in_use: bool = False
    prev: _Chunk | None = None
    next: _Chunk | None = None


def _bin_for(size: int) -> int:
    value = max(size, GRANULE) >> 8
    return min(value.bit_length() - 1, _NUM_BINS - 1)


class BFCModel:
    """TensorFlow's best-fit-with-coalescing allocator (allow_growth on)."""

    name = "bfc"

    def __init__(self, memory_limit: int = 1 << 46) -> None:
        self.memory_limit = memory_limit
        self.region_bytes = _INITIAL_REGION
        self.total_region_bytes = 0
        self.in_use = 0
        self.peak = 0
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(_NUM_BINS)]
        self._by_addr: dict[int, _Chunk] = {}
        self._next_addr = 1 << 46  # regions are placed downward from here
        self._regions = 0

    # free-chunk bins, each a sorted list of (size, addr)
    def _insert_free(self, c: _Chunk) -> None:
        bisect.insort(self._bins[_bin_for(c.size)], (c.size, c.addr))

    def _remove_free(self, c: _Chunk) -> None:
        b = self._bins[_bin_for(c.size)]
        i = bisect.bisect_left(b, (c.size, c.addr))
        del b[i]

    def _find(self, size: int) -> _Chunk | None:
        for b in range(_bin_for(size), _NUM_BINS):
            entries = self._bins[b]
            i = bisect.bisect_left(entries, (size, -1))
            if i < len(entries):
                _, addr = entries[i]
                chunk = self._by_addr[addr]
                self._remove_free(chunk)
                if chunk.size >= 2 * size or chunk.size - size >= _MAX_INTERNAL_FRAGMENTATION:
                    rest = _Chunk(chunk.addr + size, chunk.size - size, chunk.region,
                                  prev=chunk, next=chunk.next)
                    if chunk.next is not None:
                        chunk.next.prev = rest
                    chunk.next = rest
                    chunk.size = size
                    self._by_addr[rest.addr] = rest
                    self._insert_free(rest)
                chunk.in_use = True
                return chunk
        return None

    def _extend(self, size: int) -> bool:
        available = self.memory_limit - self.total_region_bytes
        if size > available:
            return False
        grew = False
        while size > self.region_bytes:
            self.region_bytes *= 2
            grew = True
        nbytes = min(self.region_bytes, available)
        if not grew:
            self.region_bytes *= 2
        self._next_addr -= nbytes + (1 << 20)  # below the last, not adjacent to it
        chunk = _Chunk(self._next_addr, nbytes, self._regions)
        self._regions += 1
        self.total_region_bytes += nbytes
        self._by_addr[chunk.addr] = chunk
        self._insert_free(chunk)
        return True

    def alloc(self, nbytes: int) -> tuple[int, int]:
        size = rounded(nbytes)
        if size == 0:
            size = GRANULE
        chunk = self._find(size)
        if chunk is None:
            if not self._extend(size):
                raise MemoryError(f"simulated allocator out of memory for {size} bytes")
            chunk = self._find(size)
            assert chunk is not None
        self.in_use += chunk.size
        self.peak = max(self.peak, self.in_use)
        return chunk.addr, chunk.size

    def free(self, handle: int) -> None:
        c = self._by_addr[handle]
        c.in_use = False
        self.in_use -= c.size
        # merge with free neighbours in the same region
        nxt = c.next
        if nxt is not None and not nxt.in_use:
            self._remove_free(nxt)
            c.size += nxt.size
            c.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = c
            del self._by_addr[nxt.addr]
        prv = c.prev
        if prv is not None and not prv.in_use:
            self._remove_free(prv)
            prv.size += c.size
            prv.next = c.next
            if c.next is not None:
                c.next.prev = prv
            del self._by_addr[c.addr]
            c = prv
        self._insert_free(c)

    def reset_peak(self) -> None:
        self.peak = self.in_use


def make(name: str) -> ExactModel | BFCModel:
    if name == "bfc":
        return BFCModel()
    if name == "exact":
        return ExactModel()
    raise ValueError(f"allocator must be 'bfc' or 'exact', got {name!r}")
