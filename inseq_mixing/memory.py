"""Resident memory: what the process holds, beside what is alive.

On Linux, glibc keeps freed chunks below its mmap threshold (which rises to 32 MiB as large chunks are freed) in its
heap, and the holes that a long input's temporaries leave between longer-lived tensors (a traced forward pass's
records, blocks of positions growing along a causal triangle) are neither reused nor returned to the operating system:
the process's resident memory grows past what is alive, and a process is killed by its resident peak.
:func:`release_freed_memory`, called at chunk, block and layer boundaries, gives the heap's free pages back whenever it
holds more than :data:`HELD_FREE_BYTES`, so the resident peak stays within that bound of what is alive (measured on a
GPT-2-small-sized model, DecompX at 1,000 tokens: see benchmarks/README.md).
"""

import ctypes
import functools
import os
import sys

#: How far the process's resident memory may grow past its lowest point since the last give-back before
#: :func:`release_freed_memory` gives the heap's free pages back: a bound on what the process holds above what is
#: alive, to within this much. Giving back costs page faults when the memory is used again, so it happens only past
#: this bound (short inputs never reach it).
HELD_FREE_BYTES = 256 * 2**20

_PAGE_BYTES = 4096
_RESIDENT = {"floor": None}  # the lowest resident memory seen since the last give-back


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl, Windows: their allocators give
    large freed blocks back by themselves)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    global _PAGE_BYTES
    _PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
    return trim


def resident_bytes() -> int:
    """The process's resident memory (``/proc/self/statm``; about 10 µs to read)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def release_freed_memory(keep: int = HELD_FREE_BYTES) -> None:
    """Give the heap's free pages back to the operating system (glibc's ``malloc_trim(0)``) when the resident memory
    has grown more than ``keep`` bytes past its lowest point since the last give-back: then what the process holds
    above what is alive stays within about ``keep`` at the places this is called. Cheap enough for every chunk boundary
    (a read of ``/proc/self/statm``). A no-op without glibc, and for GPU memory (PyTorch's own allocator).

    (The check reads the resident memory, not glibc's free-byte count: pages given back still count as free in the
    heap, so that count stays high after a give-back and would call for one at every check.)"""
    trim = _malloc_trim()
    if trim is None:
        return
    now = resident_bytes()
    floor = _RESIDENT["floor"]
    if floor is None or now < floor:
        _RESIDENT["floor"] = floor = now
    if now > floor + keep:
        trim(0)
        _RESIDENT["floor"] = resident_bytes()


def available_bytes(device) -> int | None:
    """The memory a computation on ``device`` can still take: a CUDA device's free memory (its driver's count, plus
    what PyTorch's allocator holds unused), the operating system's available memory for the CPU (``MemAvailable`` of
    ``/proc/meminfo``); None where it cannot be read."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
