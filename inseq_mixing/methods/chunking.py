"""One chunking rule for every method: a bound on the largest temporary tensor, and how many items fit under it.

Every method that materialises per-(position, token) work splits it into chunks of *items* (positions, zeroed tokens,
copies of a sentence: each method's docstring says which). ``max_chunk_elements`` is always the number of elements of
the largest temporary tensor one chunk creates; a chunk holds at least one item, so a bound smaller than one item's
tensor still runs, one item at a time. Peak memory above the model is then about ``max_chunk_elements`` times the
element size (4 bytes in float32) times a small constant for the few temporaries alive at once.
"""

#: The default bound: 2**22 elements (16 MiB in float32) for the largest temporary tensor of one chunk. Measured on a
#: 2-core CPU (benchmarks/README.md, "Chunk size"): against 2**24, ALTI, ALTI-logit, GlobEnc and DecompX on a 120-token
#: GPT-2-small-sized input take 0.4–0.6× the time, ALTI on Whisper's 1,500 frames 0.45×, batches of 16 short texts the
#: same; smaller bounds are slower again (more, smaller kernels).
DEFAULT_CHUNK_ELEMENTS = 2**22


def items_per_chunk(elements_per_item: int, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """How many items go in one chunk: as many as keep the chunk's largest tensor within ``max_chunk_elements``, and
    at least one."""
    return max(1, max_chunk_elements // max(1, elements_per_item))


def chunk_slices(num_items: int, elements_per_item: int, max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> list:
    """Consecutive slices over ``num_items`` items, each a chunk of :func:`items_per_chunk` items."""
    size = items_per_chunk(elements_per_item, max_chunk_elements)
    return [slice(start, min(start + size, num_items)) for start in range(0, num_items, size)]
