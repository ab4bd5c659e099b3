"""Resident memory beside live memory: glibc keeps the holes freed tensors leave in its heap, and
``inseq_mixing.memory.release_freed_memory`` gives them back past its bound."""

import subprocess
import sys

import pytest

from inseq_mixing.memory import _malloc_trim

#: In a fresh interpreter: a heap with 30 holes of 8 MiB between kept 64 KiB tensors (a freed 16 MiB tensor first
#: raises glibc's mmap threshold, so the 8 MiB ones come from the heap), the resident memory grown past the floor set
#: before them: with the holes freed, after a release with a bound above them (nothing given back), and after one with
#: a bound below them (given back).
FRAGMENTED_HEAP = r"""
import torch
from inseq_mixing.memory import release_freed_memory

def resident():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 2**10  # MiB

large = torch.ones(4 * 2**20)  # 16 MiB, mmapped; freeing it raises the mmap threshold to 16 MiB
del large
release_freed_memory()  # the floor: before the holes
kept, holes = [], []
for _ in range(30):
    holes.append(torch.ones(2**21))  # 8 MiB each, written: resident
    kept.append(torch.ones(2**14))
del holes
before = resident()
release_freed_memory(keep=1024 * 2**20)
unchanged = resident()
release_freed_memory(keep=16 * 2**20)
print(before, unchanged, resident())
"""


@pytest.mark.skipif(_malloc_trim() is None, reason="glibc's malloc_trim is Linux's C library's")
def test_freed_holes_stay_resident_until_given_back_past_the_bound():
    result = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    before, unchanged, after = (float(value) for value in result.stdout.split())
    assert unchanged > after + 200  # the 240 MiB of holes were resident until given back...
    assert abs(unchanged - before) < 50  # ...and a bound above them gives nothing back
