"""One chunking rule for every method: a bound on the largest temporary tensor, and how many items fit under it.

Every method that materialises per-(position, token) work splits it into chunks of *items* (positions, zeroed tokens,
copies of a sentence: each method's docstring says which). ``max_chunk_elements`` is always the number of elements of
the largest temporary tensor one chunk creates; a chunk holds at least one item, so a bound smaller than one item's
tensor still runs, one item at a time. Peak memory above the model is then about ``max_chunk_elements`` times the
element size (4 bytes in float32) times a small constant for the few temporaries alive at once.

What the C library keeps of freed memory on top is bounded at chunk boundaries by
:func:`inseq_mixing.memory.release_freed_memory`.
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
    return consecutive(num_items, items_per_chunk(elements_per_item, max_chunk_elements))


def consecutive(num_items: int, size: int) -> list:
    """Consecutive slices of ``size`` items over ``num_items`` (the last may be shorter)."""
    return [slice(start, min(start + size, num_items)) for start in range(0, num_items, size)]


#: A causal triangle's chunks hold at most about this share of its items: a chunk of ``c`` items along one side
#: computes the ``c (c - 1) / 2`` pairs past the causal edge inside it, so narrow chunks keep that waste near
#: ``n² / 16`` of the ``n² / 2`` pairs needed.
CAUSAL_CHUNK_SHARE = 8
#: Where the wasted pairs cost elementwise work only (ALTI's proximity, the norms), a chunk is not narrowed below this
#: many elements: small work is faster whole than in more, smaller operations. Measured on a 2-core CPU
#: (GPT-2-small-sized, 21 tokens, both rules in turn in one process): ALTI-logit on a batch of 16 0.37 s narrowed
#: (chunks of 3 positions) vs 0.39–0.47 s (chunks of 15); on one sentence 0.058–0.060 s either way (one chunk),
#: 0.062 s in chunks of 4.
NARROWED_ELEMENTS = 2**20


def causal_chunk_slices(
    num_items: int,
    elements_per_item: int,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    smallest_chunk_elements: int | None = None,
    fewest_items: int = 1,
    device_type: str = "cpu",
    causal: bool = True,
) -> list:
    """:func:`chunk_slices` for the items along one side of a causal triangle (queries, or zeroed keys), narrowed to
    about ``num_items / CAUSAL_CHUNK_SHARE`` items (at least ``fewest_items``, and as many as make
    ``smallest_chunk_elements``, default :data:`NARROWED_ELEMENTS`) so that few pairs past the causal edge are
    computed; never above the memory bound. ``causal=False`` (a square, not a triangle): :func:`chunk_slices`.

    Narrowed on the CPU only (``device_type``), where the wasted pairs cost their arithmetic. On an accelerator a
    layer's chunks stay as wide as the memory bound allows: there the cost of small work is the number of kernels
    and their launches (issue 26's H100 profile: thousands of small kernels per batch), not the pairs past the edge.
    Not measured on a GPU yet."""
    if not causal or device_type != "cpu":
        return chunk_slices(num_items, elements_per_item, max_chunk_elements)
    if smallest_chunk_elements is None:
        smallest_chunk_elements = NARROWED_ELEMENTS
    narrow = max(-(-num_items // CAUSAL_CHUNK_SHARE), fewest_items)
    if smallest_chunk_elements:
        narrow = max(narrow, items_per_chunk(elements_per_item, smallest_chunk_elements))
    return consecutive(num_items, min(items_per_chunk(elements_per_item, max_chunk_elements), narrow))


#: On a CPU, the parts of one tile of (query, key) pairs are kept within this many elements (4 MiB in float32), so that
#: what a tile writes is read again while it is still in the cache. Measured on a 2-core CPU (32 MiB L3, 2 MiB L2 per
#: core; benchmarks/README.md, "Tiles of pairs"): the ALTI parts of Whisper's 1,500 encoder frames (d_model 512, 8
#: heads) in tiles of 2**20 elements took 1.1 s per layer, in chunks of whole key rows of 2**22 elements 8.5–10 s.
CPU_TILE_ELEMENTS = 2**20
#: Keys in one tile on a CPU: tiles of 16–128 keys were within 10% of each other in that measurement.
CPU_TILE_KEYS = 32


def pair_tiles(
    num_queries: int,
    num_keys: int,
    elements_per_pair: int,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    device_type: str = "cpu",
    causal: bool = False,
) -> list[tuple[slice, slice]]:
    """Tiles ``(queries, keys)`` that cover the (query, key) pairs of one sub-block, each tile's work at most
    ``max_chunk_elements`` (at least one pair).

    On a CPU, tiles of at most :data:`CPU_TILE_KEYS` keys and :data:`CPU_TILE_ELEMENTS` elements: the work per pair
    is elementwise, and what stays in the cache between its passes is what makes it fast. On an accelerator, whole
    key rows and as many queries as the bound allows (fewer, larger kernels). ``causal``: keys after a tile's last
    query are left out, and tiles with none before it are skipped (their pairs are all in the future)."""
    if device_type == "cpu":
        keys_per_tile = min(num_keys, CPU_TILE_KEYS)
        bound = min(max_chunk_elements, CPU_TILE_ELEMENTS)
    else:
        keys_per_tile, bound = num_keys, max_chunk_elements
    keys_per_tile = max(1, min(keys_per_tile, items_per_chunk(elements_per_pair, bound)))
    queries_per_tile = items_per_chunk(keys_per_tile * elements_per_pair, bound)
    tiles = []
    for queries in consecutive(num_queries, queries_per_tile):
        for keys in consecutive(min(num_keys, queries.stop) if causal else num_keys, keys_per_tile):
            tiles.append((queries, keys))
    return tiles
