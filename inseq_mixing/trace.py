"""One teacher-forced forward pass that records what the context-mixing methods need.

Per layer it records the block input and output, the input of every layer norm (whose statistics the methods freeze)
and, for each attention sub-block, the attention probabilities (after softmax), the value vectors, the attention
output (after the output projection) and, for cross-attention, the call itself so that it can be re-run on new
queries. Hooks are removed and the model's attention implementation and
training flag are restored in ``finally`` blocks, so a failed call leaves the model exactly as it was.

**Memory.** Every layer's probabilities together are ``layers × heads × T²`` (9 of a GPT-2-small trace's 9.85 GB at
4,096 tokens; 34 GB for an 8B model in bfloat16). Above :data:`KEPT_PROBS_BYTES` the trace keeps none of them: it keeps
each attention call's arguments instead (the sub-block's input, the shared mask and positions: ``T × d_model`` a layer)
and recomputes a layer's probabilities when a method reads them (:class:`ProbsSource`: the same module on the same
arguments, in eager attention and eval mode: the same numbers, bit for bit), holding the last layer read and no
other. The methods read the probabilities a layer at a time, so a trace holds one layer's ``heads × T²`` at most.

**Blocks of query rows.** Such a long trace also runs the forward pass's eager attention a block of query rows at a
time (:func:`eager_in_row_blocks`: the family's own eager function on the block's queries, every key; softmax is per
row, so each row is what the whole call gives), and a method that reads a layer's probabilities by rows
(:meth:`AttentionTrace.probs_rows`) gets each block recomputed from the call's query and key states, captured once per
layer: neither the forward pass nor such a read holds a layer's ``heads × T²``, only a block's
(:data:`ROW_BLOCK_BYTES`). Modules that do not take their attention function from transformers' ``AttentionInterface``
run whole, as before.

**Records a method reads.** ``records="attention"`` (attention rollout and flow, which read the probabilities and
nothing else) keeps of each layer only its input and output and what recomputes its probabilities; the value vectors,
the attention output and the norms' inputs are dropped as they are recorded (:class:`Unrecorded` holds their shape):
three ``T × d_model`` tensors a layer fewer on GPT-2.

**Layers rebuilt when read.** A long trace of a decoder-only or encoder-only model (one that keeps no probabilities)
keeps of each layer only its input, its output and its call (the mask and positions it was given, which every layer
shares). A method that reads anything else of a layer gets that layer's records (``records``' own) rebuilt
(:class:`RecomputedLayer`): the block run again on its recorded input and call with the trace's hooks, in eager
attention, by the same blocks of rows, in eval mode (the same numbers, bit for bit), one layer held at a time. A long
trace then holds one ``T × d_model`` tensor a layer where it held five and a half (two for ``"attention"``), for one
more pass through a block per layer read.

**No causal mask kept.** The model gives eager attention an additive causal mask of one float per pair of positions
(0.27 GB at 8,192 tokens, shared by every layer). When a long trace's blocks take their attention function from
transformers and the mask is exactly the causal one (checked entry by entry), their kept calls drop it
(:meth:`_Recorder.drop_masks`), and a block run again makes each block of rows' part of it (:func:`causal_rows`: the
same numbers). A padded batch's mask, a sliding window's or a prefix read both ways is kept, and so is the mask of a
stack with other token mixers (they read it themselves).
"""

import contextvars
import dataclasses
import functools
import inspect
import itertools
import logging
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import transformers
from torch import nn

from .deferred import check
from .memory import release_freed_memory
from .specs import AttentionSpec, HeadSpec, LayerSpec, ModelSpec, StackSpec, get_spec
from .specs.base import InjectedInputs, LayerScale, MixerSpec, NoFFN, NoMixer, ParallelMixers, SharedAttention

logger = logging.getLogger(__name__)

#: transformers 4.x attention modules (T5's) return their probabilities only when asked. transformers 5 always returns
#: them from eager attention, and asking would make it install output-recording hooks that stay on the model.
NEEDS_OUTPUT_ATTENTIONS = int(transformers.__version__.split(".")[0]) < 5


class TraceError(RuntimeError):
    """Raised when the forward pass cannot be recorded as needed."""


#: What a trace can keep of each layer: everything the methods read (``"all"``), or only what rollout and attention
#: flow read (``"attention"``: the layer's input and output, and what recomputes its attention probabilities).
RECORDS = ("all", "attention")


class Unrecorded:
    """A record a trace taken with ``records="attention"`` dropped: its ``shape`` only (what sizes the blocks a
    layer is read by); reading anything else raises :class:`TraceError`, never a wrong number."""

    def __init__(self, name: str, shape: torch.Size):
        self.name, self.shape = name, torch.Size(shape)

    def dim(self) -> int:
        return len(self.shape)

    def __getattr__(self, attribute: str):
        raise TraceError(f"This trace kept only what attention rollout and flow read; its {self.name} were not "
                         f"recorded. Trace with records='all' to read them.")  # fmt: skip

    def __repr__(self) -> str:
        return f"Unrecorded({self.name!r}, {tuple(self.shape)})"


#: Above this many bytes of attention probabilities (every layer's together), a trace keeps none of them and
#: recomputes a layer's when it is read (:class:`ProbsSource`); below, it keeps them (no recomputation).
KEPT_PROBS_BYTES = 2**28


#: The bytes of one block of query rows' attention scores (float32), in a long trace's forward pass and its reads.
ROW_BLOCK_BYTES = 2**26


def rows_per_block(batch: int, heads: int, keys: int, block_bytes: int | None = None) -> int:
    """How many query rows of ``(batch, heads, rows, keys)`` float32 scores fit in ``block_bytes`` (default
    :data:`ROW_BLOCK_BYTES`); at least 1."""
    return max(1, (ROW_BLOCK_BYTES if block_bytes is None else block_bytes) // (4 * batch * heads * max(keys, 1)))


def _mask_rows(mask, rows: slice, num_queries: int):
    """An attention mask or bias ``(..., queries | 1, keys)`` (T5's position bias) for the query ``rows`` only
    (broadcast ones, and arguments that are not such tensors, stay)."""
    if isinstance(mask, torch.Tensor) and mask.dim() >= 2 and mask.shape[-2] == num_queries and num_queries > 1:
        return mask[..., rows, :]
    return mask


def _mask_keys(mask, num_keys: int, keys: int):
    """A per-row mask or bias cut by :func:`_mask_rows` to its first ``keys`` key columns (others stay)."""
    if isinstance(mask, torch.Tensor) and mask.dim() >= 3 and mask.shape[-1] == num_keys:  # (batch, [heads,] q, k)
        return mask[..., :keys]
    return mask


def key_limits(mask, num_queries: int, causal: bool = False) -> torch.Tensor | None:
    """For each query row, one past the last key its attention ``mask`` (additive, or boolean: True attends) lets it
    see, over the batch and heads, on the host ``(queries,)``: the keys after it get probability exactly 0 in that
    row, so a block of rows may leave them out (a causal layer's masked half). A row that sees no key (a left-padded
    row) gets every key: its softmax spreads over all of them. None without a mask, unless ``causal`` (a dropped
    causal mask, :func:`causal_rows`: row ``i`` sees keys ``0 .. i``). One read of the device per call; computed a
    block of rows at a time."""
    if mask is None and causal:
        return torch.arange(1, num_queries + 1)
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return None
    num_keys = mask.shape[-1]
    rows = rows_per_block(1, max(mask[..., :1, :1].numel(), 1), num_keys)
    limits = []
    for start in range(0, mask.shape[-2], rows):
        block = mask[..., start : start + rows, :]
        allowed = block if block.dtype == torch.bool else block > torch.finfo(block.dtype).min / 2
        last = num_keys - allowed.flip(-1).to(torch.uint8).argmax(-1)  # no key seen: argmax 0, every key
        limits.append(last.reshape(-1, last.shape[-1]).amax(0))
    limits = torch.cat(limits).cpu()
    return limits.expand(num_queries) if limits.numel() == 1 else limits


#: Set while a long trace's block runs again without the causal mask it was given (:meth:`_Recorder.drop_masks`):
#: an attention call with no mask then gets that mask's rows, made for each block of rows (:func:`causal_rows`).
_CAUSAL_ROWS: contextvars.ContextVar[bool] = contextvars.ContextVar("causal_rows", default=False)


def causal_rows(queries: torch.Tensor, keys: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The rows ``queries`` (positions) of the additive causal mask over ``keys`` keys ``(1, 1, rows, keys)``, as
    transformers gives eager attention: 0 where a query sees a key (at or before its own position), the dtype's
    lowest value elsewhere."""
    later = torch.arange(keys, device=device)[None, :] > queries.to(device)[:, None]
    return torch.zeros(later.shape, dtype=dtype, device=device).masked_fill_(later, torch.finfo(dtype).min)[None, None]


def _block_call(default, module, query, key, value, mask, args, kwargs, rows: slice, keys: int | None = None,
                causal: bool = False):  # fmt: skip
    """The eager function ``default`` on the query ``rows`` of a call: the queries, mask and every per-row bias cut;
    with ``keys``, the keys, values, mask and per-row biases cut to the first ``keys`` keys as well (the rows' later
    keys masked: see :func:`key_limits`). ``causal``, and no mask: the causal mask's rows, made for these rows."""
    num_queries, num_keys = query.shape[2], key.shape[-2]
    args = [_mask_rows(arg, rows, num_queries) for arg in args]
    kwargs = {name: _mask_rows(arg, rows, num_queries) for name, arg in kwargs.items()}
    if causal and mask is None:
        mask = causal_rows(torch.arange(num_queries)[rows], num_keys, query.dtype, query.device)
    else:
        mask = _mask_rows(mask, rows, num_queries)
    if keys is not None and keys < num_keys:
        args = [_mask_keys(arg, num_keys, keys) for arg in args]
        kwargs = {name: _mask_keys(arg, num_keys, keys) for name, arg in kwargs.items()}
        key, value, mask = key[:, :, :keys], value[:, :, :keys], _mask_keys(mask, num_keys, keys)
    return default(module, query[:, :, rows], key, value, mask, *args, **kwargs)


def _keys_of(limits: torch.Tensor | None, rows: slice) -> int | None:
    """The keys a block of query ``rows`` sees (:func:`key_limits`), None for all."""
    return None if limits is None else int(limits[rows].max())


class _Captured(Exception):
    """Stops an attention module once its attention function has been given its query and key states."""


def _eager_by_rows(default, module, query, key, value, attention_mask, *args, seen: set | None = None, **kwargs):
    """The family's eager attention ``default`` run a block of query rows at a time; its outputs joined, no
    probabilities returned (the long trace recomputes them when read); ``seen``: the modules that called it. With no
    mask while :data:`_CAUSAL_ROWS` is set, each block gets the causal mask's rows."""
    if seen is not None:
        seen.add(module)
    batch, heads, num_queries = query.shape[:3]
    causal = attention_mask is None and _CAUSAL_ROWS.get()
    rows = rows_per_block(batch, heads, key.shape[-2])
    if rows >= num_queries:
        if causal:
            attention_mask = causal_rows(torch.arange(num_queries), key.shape[-2], query.dtype, query.device)
        return default(module, query, key, value, attention_mask, *args, **kwargs)[0], None
    rows += rows == heads  # a block's length must not equal the heads, so that the output's query axis is found
    blocks = [slice(start, start + rows) for start in range(0, num_queries, rows)]
    limits = key_limits(attention_mask, num_queries, causal)
    call = (default, module, query, key, value, attention_mask, args, kwargs)
    outputs = [_block_call(*call, block, _keys_of(limits, block), causal)[0] for block in blocks]
    axis = 1 if outputs[0].shape[1] == rows else 2  # (batch, queries, ...) or (batch, heads, queries, ...)
    return torch.cat(outputs, dim=axis), None


def _capture(store: dict, default, module, query, key, value, attention_mask, *args, **kwargs):
    store.update(function=default, call=(module, query, key, value, attention_mask, args, kwargs))
    raise _Captured


@contextmanager
def eager_in_row_blocks(capture: dict | None = None, seen: set | None = None) -> Iterator[None]:
    """While active, an attention module that asks transformers' ``AttentionInterface`` for eager attention gets its
    family's eager function run a block of query rows at a time (:func:`_eager_by_rows`; ``seen`` collects those
    modules), or, with ``capture``, the call's function and arguments stored there and the module stopped
    (:class:`_Captured`). Put back afterwards."""
    from transformers.modeling_utils import AttentionInterface

    own = AttentionInterface.__dict__["get_interface"]

    def get_interface(self, implementation, default):
        function = own(self, implementation, default)
        if implementation != "eager" or function is not default:
            return function
        if capture is not None:
            return functools.partial(_capture, capture, default)
        return functools.partial(_eager_by_rows, default, seen=seen)

    AttentionInterface.get_interface = get_interface
    try:
        yield
    finally:
        AttentionInterface.get_interface = own


class ProbsSource:
    """One attention call's probabilities, recomputed from its recorded arguments when read: the module run again on
    the same arguments under eager attention and in eval mode (the same numbers the forward pass computed). The
    sources of one trace share one slot holding the last probabilities computed, so that reading the layers one after
    another holds one layer's at a time.

    Raises (when read):
        TraceError: A recorded argument was changed in place since the forward pass.
    """

    def __init__(self, model: nn.Module, module: nn.Module, args: tuple, kwargs: dict, index: int, slot: dict):
        self.model, self.module, self.index, self.slot = model, module, index, slot
        self.causal = _CAUSAL_ROWS.get()  # recorded without its causal mask: made by rows when read
        self.args = args
        self.kwargs = {key: value for key, value in kwargs.items() if key not in CACHE_ARGUMENTS or value is None}
        tensors = [value for value in (*args, *self.kwargs.values()) if isinstance(value, torch.Tensor)]
        self.versions = [(tensor, tensor._version) for tensor in tensors]

    def probs(self) -> torch.Tensor:
        if self.slot.get("owner") is self and "probs" in self.slot:
            return self.slot["probs"]
        if self.causal:  # its mask is made by rows: every row at once
            probs = self.rows(slice(None))
            self.slot["probs"] = probs
            return probs
        self._check()
        self.slot.clear()  # the previous layer's probabilities are freed before this one's are computed
        with torch.no_grad(), eval_mode(self.module), eager_attention(self.model):
            probs = self._probs_of(self.module(*self.args, **self.kwargs))
        self.slot.update(owner=self, probs=probs)
        return probs

    def rows(self, queries: slice) -> torch.Tensor:
        """The probabilities of the query rows ``queries`` ``(batch, heads, rows, keys)``: computed by the family's
        eager function from the call's query and key states (captured once, then held as the slot's), or, for a
        module that does not take its attention function from transformers, sliced from the whole layer's."""
        if self.slot.get("owner") is not self:
            self._check()
            self.slot.clear()
            captured = {}
            with torch.no_grad(), eval_mode(self.module), eager_attention(self.model), eager_in_row_blocks(captured):
                try:
                    probs = self._probs_of(self.module(*self.args, **self.kwargs))
                except _Captured:
                    probs = None
            if probs is None:
                _, query, _, _, mask, _, _ = captured["call"]
                captured["limits"] = key_limits(mask, query.shape[2], self.causal)
            self.slot.update(owner=self, **({"probs": probs} if probs is not None else captured))
        if "probs" in self.slot:
            return self.slot["probs"][:, :, queries]
        num_keys = self.slot["call"][2].shape[-2]
        with torch.no_grad():
            probs = _block_call(self.slot["function"], *self.slot["call"], queries,
                                _keys_of(self.slot["limits"], queries), self.causal)[1].detach()  # fmt: skip
        return (
            probs if probs.shape[-1] == num_keys else torch.nn.functional.pad(probs, (0, num_keys - probs.shape[-1]))
        )

    def _probs_of(self, output: tuple) -> torch.Tensor:
        probs = output[self.index]
        if probs is None:
            raise TraceError("An attention module returned no probabilities under eager attention, so its "
                             "attention cannot be read; load the model with attn_implementation='eager'.")  # fmt: skip
        return probs.detach()

    def _check(self) -> None:
        if any(tensor._version != version for tensor, version in self.versions):
            raise TraceError("An attention call's recorded inputs were changed in place after the forward pass: its "
                             "probabilities cannot be recomputed. Trace again.")  # fmt: skip


@dataclass
class AttentionTrace:
    """What one attention sub-block computed.

    Attributes:
        kept_probs: Attention probabilities ``(batch, heads, queries, keys)``, when the trace keeps them; else None
            and :attr:`source` recomputes them (read them as :attr:`probs`).
        values: Value vectors ``(batch, keys, kv_heads, head_dim)``, value-projection bias included.
        output: Attention output after the output projection ``(batch, queries, d_model)``.
        norm_input: Input of the sub-block's layer norm ``(batch, queries, d_model)``: its statistics are the ones
            the methods freeze. Without a norm (OLMo-2), the sub-block's input.
        call: ``(args, kwargs)`` of the module call, kept for cross-attention so it can be re-run on new queries.
        cross_keys: The keys and values of a kept cross-attention call ``(batch, heads, keys, head_dim)``, computed
            on the first re-run (False where the module does not take them from a cache), so that re-runs on new
            queries read them instead of projecting the encoder states again.
        source: Where the probabilities are recomputed from when they are not kept.
        latent_norm_input: Input of a latent attention's latent norm ``(batch, keys, rank)`` (its statistics frozen
            there), or None.
        num_heads: The query heads (the probabilities' second axis), for sizing blocks of rows.
    """

    kept_probs: torch.Tensor | None
    values: torch.Tensor
    output: torch.Tensor
    norm_input: torch.Tensor
    call: tuple[tuple, dict] | None = None
    cross_keys: tuple[torch.Tensor, torch.Tensor] | bool | None = None
    source: ProbsSource | None = None
    latent_norm_input: torch.Tensor | None = None
    num_heads: int | None = None

    @property
    def probs(self) -> torch.Tensor:
        """Attention probabilities ``(batch, heads, queries, keys)``: kept, or recomputed (:class:`ProbsSource`)."""
        return self.kept_probs if self.kept_probs is not None else self.source.probs()

    @property
    def heads(self) -> int:
        """The query heads (the probabilities' second axis)."""
        if self.kept_probs is not None:
            return self.kept_probs.shape[1]
        return self.num_heads or self.values.shape[2]

    def probs_rows(self, queries: slice) -> torch.Tensor:
        """The probabilities of the query rows ``queries`` ``(batch, heads, rows, keys)``: a long trace computes only
        those (:meth:`ProbsSource.rows`), so that reading a layer block by block never holds all of it."""
        return self.kept_probs[:, :, queries] if self.kept_probs is not None else self.source.rows(queries)

    def block_rows(self, block_bytes: int | None = None) -> int:
        """How many query rows a read takes at once: a kept layer's every row; a long trace's, as many as keep a
        block's float32 probabilities within ``block_bytes`` (default :data:`ROW_BLOCK_BYTES`)."""
        batch, num_queries = self.output.shape[:2]
        if self.kept_probs is not None:
            return max(num_queries, 1)
        return rows_per_block(batch, self.heads, self.values.shape[1], block_bytes)

    def row_blocks(self, block_bytes: int | None = None, first_row: int = 0) -> Iterator[tuple[slice, torch.Tensor]]:
        """``(queries, probabilities of those rows)`` for consecutive blocks of :meth:`block_rows` query rows
        covering the layer from ``first_row`` on; a kept layer is one block."""
        num_queries = self.output.shape[1]
        if self.kept_probs is not None:
            yield slice(first_row, num_queries), self.kept_probs[:, :, first_row:]
            return
        rows = self.block_rows(block_bytes)
        for start in range(first_row, num_queries, rows):
            queries = slice(start, min(start + rows, num_queries))
            yield queries, self.source.rows(queries)

    def rerun(
        self, module: nn.Module, query_states: torch.Tensor, batch_index: torch.Tensor, queries: slice
    ) -> torch.Tensor:
        """Re-run the recorded (cross-)attention call on new query inputs, with the call's other arguments (keys,
        masks, position biases) taken from the record for each row. The methods re-run modules only through here:
        the model's calling conventions stay in the trace.

        Args:
            module: The attention module that was recorded.
            query_states: New module inputs ``(rows, len(queries), d_model)``.
            batch_index: For each row, the index of the recorded batch element it belongs to.
            queries: Which recorded query positions the rows hold.

        Returns:
            The attention output ``(rows, len(queries), d_model)``.
        """
        if self.call is None:
            raise ValueError("This attention call was not kept: only cross-attention calls are, for re-running.")
        args, kwargs = self.call
        batch_size, num_queries = self.output.shape[:2]

        def select(value):
            return _select_rows(value, batch_size, num_queries, batch_index, queries)

        kwargs = {key: select(value) for key, value in kwargs.items()}
        for key in CACHE_ARGUMENTS:  # the recorded call used no cache
            kwargs.pop(key, None)
        cached = self.keys_and_values(module)
        if cached is not None:  # the encoder's keys and values, projected once, from an already-filled cache
            keys, values = (tensor[batch_index] for tensor in cached)
            kwargs[_cache_argument(module)] = _filled_cross_cache(keys, values, module.layer_idx)
        if args:
            args = (query_states, *[select(arg) for arg in args[1:]])
        else:
            kwargs["hidden_states"] = query_states
        return module(*args, **kwargs)[0]

    def keys_and_values(self, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cross-attention's keys and values of the recorded call, or None where the module does not read them
        from transformers' ``EncoderDecoderCache`` (then every re-run projects the encoder states again)."""
        if self.cross_keys is None:
            self.cross_keys = False
            layer = getattr(module, "layer_idx", None)
            if layer is not None and self.call is not None:
                from transformers.cache_utils import DynamicCache, EncoderDecoderCache

                args, kwargs = self.call
                kwargs = {key: value for key, value in kwargs.items() if key not in CACHE_ARGUMENTS}
                cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
                try:
                    with torch.no_grad():
                        module(*args, **kwargs, **{_cache_argument(module): cache})
                except TypeError:  # a module without a cache argument
                    return None
                stored = cache.cross_attention_cache.layers
                if cache.is_updated.get(layer) and len(stored) > layer and stored[layer].keys is not None:
                    self.cross_keys = (stored[layer].keys.detach(), stored[layer].values.detach())
        return self.cross_keys or None


#: The cache arguments of attention modules across transformers versions (``cache`` from 5.24, ``past_key_values``
#: before), and the positions that go with a cache.
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "cache_position")


def _cache_argument(module: nn.Module) -> str:
    """The name under which ``module``'s forward takes a cache."""
    import inspect

    parameters = inspect.signature(module.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _filled_cross_cache(keys: torch.Tensor, values: torch.Tensor, layer: int):
    """An ``EncoderDecoderCache`` whose cross-attention entry for ``layer`` holds ``keys`` and ``values``, marked as
    filled: the attention module reads them instead of projecting its key/value states."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    cache.cross_attention_cache.update(keys, values, layer)
    cache.is_updated[layer] = True
    return cache


def _select_rows(value, batch_size: int, num_queries: int, batch_index: torch.Tensor, queries: slice):
    """Index a recorded call argument to the new batch rows and query positions: tensors whose first axis is the batch
    (or 1, broadcast), and 4-d masks and position biases ``(batch | 1, heads | 1, queries, keys)``."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if value.shape[0] == batch_size:
        value = value[batch_index]
    elif value.shape[0] == 1:
        value = value.expand(len(batch_index), *value.shape[1:])
    if value.dim() == 4 and value.shape[-2] == num_queries:
        value = value[..., queries, :]
    return value


@dataclass
class MixerTrace:
    """What one token mixer that is not attention computed (:class:`~.specs.base.MixerSpec`). The methods freeze its
    mixing from these when they read it (:mod:`inseq_mixing.methods.mixers`), one layer's at a time.

    Attributes:
        input: The mixer's input as the module got it (after the branch's norm) ``(batch, positions, d_model)``.
        mask: The padding mask the module was given (``attention_mask``), or None.
        output: The mixer's output ``(batch, positions, d_model)``.
        norm_input: Input of the branch's norm (its statistics frozen there).
        slot: Shared by a trace's mixers: the one frozen mixer the methods hold (the last one read).
        position_embeddings: The rotary ``(cos, sin)`` the module was given (gated attention), or None.
        branches: Parallel mixers' (:class:`~.specs.base.ParallelMixers`): each branch's ``(input, mask, rotary
            embeddings)`` as its module got them; ``output`` is then their scaled outputs' sum. None: one mixer.
        extra: A block whose mixer reads a shared attention block (:class:`~.specs.base.SharedAttention`):
            ``embeddings``, the attention's mask (``shared_mask``) and ``layer_idx`` of the block's call; ``input`` is
            then the block's input (before any norm) and ``mask`` the mixer's padding mask.
    """

    input: torch.Tensor
    mask: torch.Tensor | None
    output: torch.Tensor
    norm_input: torch.Tensor
    slot: dict
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None
    branches: tuple[tuple, ...] | None = None
    extra: dict | None = None

    @property
    def call(self) -> dict:
        """The keyword inputs besides its input and mask the module was given that freezing it reads (parallel
        mixers: each branch's input, mask and rotary embeddings; a block with a shared attention block: the
        embeddings, the attention's mask and the layer index too)."""
        if self.branches is not None:
            return {"branches": self.branches}
        found = {} if self.position_embeddings is None else {"position_embeddings": self.position_embeddings}
        return found | (self.extra or {})


@dataclass
class LayerTrace:
    """Input, output and attention records of one block, and the input of its FFN sub-block's norm (without a norm,
    of the FFN), and of the norm on the FFN's output if it has one (``ffn_out_norm_input``: the FFN's raw output); a
    mixture of experts' routing at this pass (``ffn_routing``: weights and experts ``(batch, positions, k)``); what
    the stack adds to this block's output before the next block reads it (``injected``, ``(batch, positions,
    d_model)``: :class:`~.specs.base.InjectedInputs`), or None."""

    input: torch.Tensor
    output: torch.Tensor
    self_attn: AttentionTrace | MixerTrace
    ffn_norm_input: torch.Tensor
    cross_attn: AttentionTrace | None = None
    ffn_out_norm_input: torch.Tensor | None = None
    ffn_routing: tuple[torch.Tensor, torch.Tensor] | None = None
    injected: torch.Tensor | None = None


@dataclass
class StackTrace:
    """Records of an encoder or decoder stack.

    Attributes:
        layers: One record per block.
        mask: ``(batch, positions)`` boolean mask of real (non-padding) tokens.
        causal: Whether self-attention is causal.
        final_norm_input: Input of the stack's final norm, if it has one.
    """

    layers: list[LayerTrace]
    mask: torch.Tensor
    causal: bool
    final_norm_input: torch.Tensor | None = None


#: A vision-language call's tensors with one entry per image (cut by row with the images).
PER_IMAGE = ("image_grid_thw", "image_sizes")


@dataclass
class ModelCall:
    """The model and the keyword arguments of its teacher-forced forward pass (:func:`forward_arguments`): what a
    method that runs passes of its own (AttnLRP's forward and backward passes) reads from a trace.

    ``frame_masks``: speech models, whose inputs are audio features rather than tokens: the ``(batch, frames)`` masks
    of the stacks that read audio, by stack name (``"encoder"``, or ``"decoder"`` for a CTC encoder's one stack).
    """

    model: nn.Module
    kwargs: dict
    frame_masks: dict[str, torch.Tensor] | None = None
    #: Vision-language calls from a front end that counted them: each row's images (their entries of
    #: ``pixel_values`` and ``image_sizes`` cut by row with these counts where there is one entry per image).
    image_rows: tuple[int, ...] | None = None

    @property
    def decoder_mask(self) -> torch.Tensor:
        """``(batch, positions)`` mask of the explained stack (the decoder; an encoder-only model's one stack)."""
        masks = self.frame_masks or {}
        return masks["decoder"] if "decoder" in masks else decoder_mask(self.kwargs)

    @property
    def encoder_mask(self) -> torch.Tensor:
        """``(batch, source positions)`` mask of an encoder–decoder's encoder."""
        return (self.frame_masks or {}).get("encoder", self.kwargs.get("attention_mask"))

    def rows(self, rows: torch.Tensor) -> dict:
        """The call's keyword arguments for the batch ``rows`` (repeats allowed): every per-row tensor indexed; images
        given as one flat run over the batch (Qwen2-VL's patches with ``image_grid_thw``, InternVL's tiles) cut into
        each row's images (a row holds the images whose tokens it holds, in order: :attr:`_row_images`)."""
        kwargs = {key: value[rows] if torch.is_tensor(value) else value for key, value in self.kwargs.items()}
        ranges = self._row_images
        if ranges is None:
            return kwargs
        picked = [ranges[row] for row in rows.tolist()]
        for name in PER_IMAGE:
            if self.kwargs.get(name) is not None:
                kwargs[name] = torch.cat([self.kwargs[name][first:last] for first, last, _, _ in picked])
        pixels = self.kwargs["pixel_values"]
        kwargs["pixel_values"] = torch.cat([pixels[start:stop] for _, _, start, stop in picked])
        return kwargs

    @functools.cached_property
    def _row_images(self) -> list[tuple[int, int, int, int]] | None:
        """Each batch row's images ``[first, last)`` and their entries ``[start, stop)`` of ``pixel_values``, where a
        vision-language call gives its images as one flat run over the batch: Qwen2-VL's patches (an image's are its
        grid's), the images of rows that hold several (one entry each: :attr:`image_rows`, counted by the front end),
        InternVL's equal tiles (an entry each; its images are not one per row). None where they are one per row
        (indexed as any per-row tensor). Read from the device once per call.

        Raises:
            ValueError: InternVL's image tokens are not a whole number of equal tiles, one row's at a time.
        """
        grid = self.kwargs.get("image_grid_thw")
        if grid is not None:
            entries = grid.prod(-1)  # each image's patches; its tokens: patches / merge
            tokens = entries // self.model.config.vision_config.spatial_merge_size**2
            per_row = (self.kwargs["mm_token_type_ids"] == 1).sum(-1)  # each row's image tokens
        elif self._images_in_one_run() and self.image_rows is not None and \
                self.kwargs["pixel_values"].shape[0] == sum(self.image_rows):  # fmt: skip
            per_row = torch.tensor(self.image_rows)  # one entry per image, each row's counted by the front end
            entries = tokens = per_row.new_ones(int(per_row.sum()))
        elif self._images_in_one_run():
            tiles = self.kwargs["pixel_values"].shape[0]
            per_row = (self.kwargs["input_ids"] == self.model.config.image_token_id).sum(-1)
            total = int(per_row.sum())
            if tiles == 0 or total % tiles or bool((per_row % (total // tiles)).any()):
                raise ValueError(f"{total} image tokens cannot be cut into {tiles} equal tiles, one row's at a time: "
                                 "give each row its images' tokens as the processor writes them.")  # fmt: skip
            entries, tokens = per_row.new_ones(tiles), per_row.new_full((tiles,), total // tiles)
        else:
            return None
        last = torch.searchsorted(tokens.cumsum(0), per_row.cumsum(0), right=True)  # images up to each row's end
        first = torch.cat([last.new_zeros(1), last[:-1]])
        starts = torch.cat([entries.new_zeros(1), entries.cumsum(0)])
        bounds = torch.stack([first, last, starts[first], starts[last]], dim=-1)
        return [tuple(row) for row in bounds.tolist()]

    def _images_in_one_run(self) -> bool:
        """Whether a vision-language call's ``pixel_values`` are not one per row: every image (InternVL's tiles) of
        the batch in one run, as many as they are, not as many as the rows that hold image tokens."""
        pixels, ids = self.kwargs.get("pixel_values"), self.kwargs.get("input_ids")
        token = getattr(self.model.config, "image_token_id", None)
        if pixels is None or ids is None or token is None:
            return False
        return pixels.shape[0] != ids.shape[0] or not bool((ids == token).any(-1).all())


@dataclass
class ModelTrace:
    """Records of a whole forward pass: the stacks, the model's own ``logits``, for models that soft-cap them
    (Gemma 2) the LM head's output before the cap, the call that was traced, and ``final_hidden``, what the head reads
    (the decoder's output, through its final norm). A trace taken with ``full_logits=False`` skipped the LM head's
    full-vocabulary product: ``logits`` is None and the logits a method explains are read from ``final_hidden``
    (:func:`~inseq_mixing.methods.readout.recorded_logit`). Encoder-only models: their one stack is ``decoder``
    (non-causal), ``logits`` the head's at every position ``(batch, positions, outputs)`` (None for a bare
    encoder)."""

    spec: ModelSpec
    decoder: StackTrace
    logits: torch.Tensor | None
    encoder: StackTrace | None = None
    logits_before_softcap: torch.Tensor | None = None
    call: ModelCall | None = None
    final_hidden: torch.Tensor | None = None

    @property
    def explained_logits(self) -> torch.Tensor:
        """The logits the logit methods decompose: the LM head's output, before the final soft-cap if the model has
        one (``spec.logit_softcap``), else the model's own logits."""
        return self.logits if self.logits_before_softcap is None else self.logits_before_softcap


class _Recorder:
    """Collects one stack's tensors through forward hooks."""

    def __init__(self, stack: StackSpec, keep_cross_call: bool, model: nn.Module, slot: dict | None = None,
                 records: str = "all", rebuilt: bool = False):  # fmt: skip
        self.stack = stack
        self.keep_cross_call = keep_cross_call
        self.model = model
        self.slot = slot  # None: keep the probabilities; else the trace's one slot of recomputed ones
        self.records, self.rebuilt = records, rebuilt  # rebuilt: layers kept as input, output, call (RecomputedLayer)
        layer_store = _AttentionRecords if records == "attention" and not rebuilt else dict
        self.store: list[dict] = [layer_store() for _ in stack.layers]
        self.mixer_slot: dict = {}  # the one frozen token mixer the methods hold (MixerTrace.slot)
        self.final: dict = {}
        self.injected: list[torch.Tensor] = []  # added after block l, dense (StackSpec.injected)

    def register(self, hooks: ExitStack) -> None:
        """Register every hook; a module listed for several layers (ALBERT's shared block) gets one hook per kind that
        records its k-th call into the k-th of those layers (see :func:`_in_call_order`)."""
        pending: dict[tuple[int, str], tuple[nn.Module, list]] = {}

        def add(module: nn.Module, kind: str, hook) -> None:
            pending.setdefault((id(module), kind), (module, []))[1].append(hook)

        if self.stack.final_norm is not None:
            add(self.stack.final_norm, "pre", self._norm_hook(self.final, "input"))
        if self.stack.injected is not None:
            add(self.stack.injected.module, "pre_kwargs", self._injected_hook(self.stack.injected, self.injected))
        for store, layer in zip(self.store, self.stack.layers, strict=True):
            add(layer.module, "pre_kwargs", self._input_hook(store, keep_call=self.rebuilt))
            add(layer.module, "post", self._output_hook(store))
            if self.rebuilt:  # the rest is recorded when a method reads it (RecomputedLayer)
                continue
            ffn_entry = layer.ffn.norm if layer.ffn.norm is not None else layer.ffn.forward
            if not isinstance(ffn_entry, nn.Module):
                raise TypeError("An FFNSpec without a norm needs a module as `forward`: the trace records its input.")
            if not isinstance(ffn_entry, NoFFN):  # a block without an FFN: its output is that input (result())
                add(ffn_entry, "pre", self._norm_hook(store, "ffn_norm_input"))
            for router in layer.ffn.routers:  # a mixture's routing, frozen at this pass
                add(router, "post", self._routing_hook(store))
            out_norm = layer.ffn.out_norm
            if isinstance(out_norm, LayerScale):  # a module of the spec's own, which the model never calls
                for module in out_norm.input_module:  # their outputs summed (one module: its output)
                    add(module, "post", self._summed_output_hook(store, "ffn_out_norm_input"))
            elif out_norm is not None:
                add(out_norm, "pre", self._norm_hook(store, "ffn_out_norm_input"))
            for name, attn in (("self", layer.self_attn), ("cross", layer.cross_attn)):
                if attn is None:
                    continue
                if attn.norm is not None:
                    add(attn.norm, "pre", self._norm_hook(store, f"{name}_norm_input"))
                if isinstance(attn.module, NoMixer):  # a block without a token mixer: nothing to record
                    continue
                if isinstance(attn, MixerSpec) and isinstance(attn.module, ParallelMixers):  # each branch's call
                    branches = attn.module.branches
                    for index, branch in enumerate(branches):
                        add(branch.spec.module, "post_kwargs", self._branch_hook(store, index, len(branches),
                                                                               branch.out_scale))  # fmt: skip
                    continue
                if isinstance(attn, MixerSpec) and isinstance(attn.module, SharedAttention):  # the block's call
                    add(layer.module, "post_kwargs", self._shared_attention_hook(store, attn.module))
                    add(attn.module.mixer.module, "post", self._output_hook(store, "self_output"))
                    continue
                if isinstance(attn, MixerSpec):  # its input, mask and output: the methods freeze its mixing
                    add(attn.module, "post_kwargs", self._mixer_hook(store, name))
                    continue
                if attn.latent is not None:
                    add(attn.latent.norm, "pre", self._norm_hook(store, f"{name}_latent_norm_input"))
                keep_call = name == "cross" and self.keep_cross_call
                add(attn.module, "post_kwargs", self._attn_hook(store, name, attn, keep_call, self.model, self.slot))
                if attn.output_module is not None:
                    add(attn.output_module, "post", self._output_hook(store, f"{name}_output"))
                add(attn.value_proj, "post", self._value_hook(store, name, attn))
        for (_, kind), (module, callbacks) in pending.items():
            hook = _in_call_order(callbacks)
            if kind == "pre":
                handle = module.register_forward_pre_hook(hook)
            elif kind == "pre_kwargs":
                handle = module.register_forward_pre_hook(hook, with_kwargs=True)
            else:
                handle = module.register_forward_hook(hook, with_kwargs=kind == "post_kwargs")
            hooks.callback(handle.remove)

    @staticmethod
    def _input_hook(store, keep_call: bool = False):
        def hook(module, args, kwargs):
            store["input"] = (args[0] if args else kwargs["hidden_states"]).detach()
            if keep_call:  # what runs the block again (its input the recorded one), no cache
                kwargs = {key: None if key in CACHE_ARGUMENTS and key != "cache_position" else value
                          for key, value in kwargs.items()}  # fmt: skip
                store["call"] = (args, kwargs, store["input"]._version)

        return hook

    @staticmethod
    def _injected_hook(injected: InjectedInputs, store: list):
        def hook(module, args, kwargs):
            store[:] = [vector.detach() for vector in injected.dense(kwargs)]

        return hook

    @staticmethod
    def _norm_hook(store, key: str):
        def hook(module, args):
            store[key] = args[0].detach()

        return hook

    @staticmethod
    def _output_hook(store, key: str = "output"):
        def hook(module, args, output):
            store[key] = (output[0] if isinstance(output, tuple) else output).detach()

        return hook

    @staticmethod
    def _summed_output_hook(store, key: str):
        def hook(module, args, output):
            output = (output[0] if isinstance(output, tuple) else output).detach()
            previous = store.get(key)  # a tensor once one module gave its output (not when records drop it)
            store[key] = previous + output if isinstance(previous, torch.Tensor) else output

        return hook

    @staticmethod
    def _routing_hook(store):
        def hook(module, args, output):
            _, weights, experts = output
            store["ffn_routing"] = (weights.detach(), experts.detach())

        return hook

    @staticmethod
    def _attn_hook(store, name: str, attn: AttentionSpec, keep_call: bool, model: nn.Module, slot: dict | None):
        def hook(module, args, kwargs, output):
            if attn.output_module is None:
                store[f"{name}_output"] = output[0].detach()
            probs = output[attn.probs_index]
            if slot is None:  # kept (or missing: refused in result())
                store[f"{name}_probs"] = probs
            else:  # recomputed when read: the call's arguments kept instead
                store[f"{name}_probs"] = ProbsSource(model, module, args, kwargs, attn.probs_index, slot)
            if keep_call:
                store[f"{name}_call"] = (args, kwargs)

        return hook

    @staticmethod
    def _mixer_hook(store, name: str):
        def hook(module, args, kwargs, output):
            call = _mixer_call(args, kwargs)
            store[f"{name}_mixer_input"], store[f"{name}_mixer_mask"], store[f"{name}_mixer_rotary"] = call
            store[f"{name}_output"] = (output[0] if isinstance(output, tuple) else output).detach()

        return hook

    @staticmethod
    def _shared_attention_hook(store, mixer: SharedAttention):
        """A block whose mixer reads a shared attention block's output (:class:`~.specs.base.SharedAttention`): the
        block's call as freezing it reads it: its input, the embeddings, both masks, the rotary embeddings and the
        layer index its shared projections' adapters are chosen by."""
        signature = inspect.signature(mixer.block.forward)

        def hook(module, args, kwargs, output):
            call = signature.bind(*args, **kwargs).arguments
            store["self_mixer_input"] = call["hidden_states"].detach()
            store["self_mixer_mask"], store["self_mixer_rotary"] = call.get("attention_mask"), call.get(
                "position_embeddings")  # fmt: skip
            store["self_mixer_extra"] = {
                "embeddings": call[mixer.embeddings].detach(),
                "shared_mask": call.get("causal_mask"),
                "layer_idx": call["layer_idx"],
            }

        return hook

    @staticmethod
    def _branch_hook(store, index: int, count: int, scale: float):
        """Branch ``index`` of ``count`` parallel mixers (:class:`~.specs.base.ParallelMixers`): its input, mask and
        rotary embeddings, and the mixer's output so far (the earlier branches' plus this one's times ``scale``, as
        the block adds them)."""

        def hook(module, args, kwargs, output):
            found = _mixer_call(args, kwargs)
            branches = store.get("self_mixer_branches") or (None,) * count
            store["self_mixer_branches"] = (*branches[:index], found, *branches[index + 1 :])
            if index == 0:  # the mixer's input: the block's normed input, as the first branch reads it
                store["self_mixer_input"], store["self_mixer_mask"] = found[:2]
            output = (output[0] if isinstance(output, tuple) else output).detach() * scale
            previous = store.get("self_output")
            store["self_output"] = previous + output if index and isinstance(previous, torch.Tensor) else output

        return hook

    @staticmethod
    def _value_hook(store, name: str, attn: AttentionSpec):
        def hook(module, args, output):
            values = output[..., attn.value_slice].detach()
            if values.untyped_storage().nbytes() > values.numel() * values.element_size():
                values = values.clone()  # a fused projection's slice (GPT-2's c_attn): not its queries' and keys'
            if values.dim() > 3:  # a latent attention's up-projection runs on (batch, 1, keys, rank)
                values = values.reshape(values.shape[0], -1, values.shape[-1])
            store[f"{name}_values"] = values.reshape(*values.shape[:-1], attn.num_kv_heads, attn.head_dim)

        return hook

    def _mixer_record(self, store: dict) -> MixerTrace:
        """A block's token mixer that is not attention: its records as a :class:`MixerTrace`."""
        return MixerTrace(input=store["self_mixer_input"], mask=store["self_mixer_mask"], output=store["self_output"],
                          norm_input=store.get("self_norm_input", store["input"]), slot=self.mixer_slot,
                          position_embeddings=store.get("self_mixer_rotary"),
                          branches=store.get("self_mixer_branches"),
                          extra=store.get("self_mixer_extra"))  # fmt: skip

    def rerun(self, index: int) -> LayerTrace:
        """Block ``index``'s whole records, from running it again on its recorded input and call with this
        recorder's hooks (see :class:`RecomputedLayer`).

        Raises:
            TraceError: The recorded input was changed in place after the forward pass.
        """
        args, kwargs, version = self.store[index]["call"]
        if self.store[index]["input"]._version != version:
            raise TraceError("A block's recorded input was changed in place after the forward pass: its records "
                             "cannot be recomputed. Trace again.")  # fmt: skip
        layer = self.stack.layers[index]
        one = _Recorder(dataclasses.replace(self.stack, layers=[layer], final_norm=None, injected=None),
                        self.keep_cross_call, self.model, self.slot, self.records)  # fmt: skip
        one.mixer_slot = self.mixer_slot  # one frozen mixer for the whole trace
        causal = self.store[index].get("dropped", False)
        with ExitStack() as hooks, torch.no_grad():
            hooks.enter_context(eval_mode(self.model))
            hooks.enter_context(eager_attention(self.model))
            if self.slot is not None:  # as the forward pass ran it
                hooks.enter_context(eager_in_row_blocks())
            one.register(hooks)
            flag = _CAUSAL_ROWS.set(causal)  # its causal mask dropped: made by blocks of rows
            hooks.callback(_CAUSAL_ROWS.reset, flag)
            layer.module(*args, **kwargs)
        record = one._layer_record(0, one.store[0], layer)
        record.injected = self.injected[index] if index < len(self.injected) else None
        return record

    def drop_masks(self, interfaced: set) -> None:
        """A long trace's kept block calls without the model's additive causal mask (``(batch, 1, T, T)``, one float
        per pair, shared by every layer): a block whose attention module took its eager function from transformers
        during the forward pass (``interfaced``), whose call holds exactly that mask (checked entry by entry), runs
        again without it, the mask's rows made for each block of rows (:data:`_CAUSAL_ROWS`). Any other mask
        (padding, sliding windows, a prefix read both ways) is kept."""
        checked: dict[int, bool] = {}
        for store, layer in zip(self.store, self.stack.layers, strict=True):
            call = store.get("call")
            attention = layer.self_attn
            if call is None or not isinstance(attention, AttentionSpec) or layer.cross_attn is not None:
                continue
            if attention.module not in interfaced:
                continue
            args, kwargs, version = call
            length = store["input"].shape[1]
            found = [("arg", at) for at, value in enumerate(args) if _square_mask(value, length)]
            found += [("kwarg", name) for name, value in kwargs.items() if _square_mask(value, length)]
            if len(found) != 1:
                continue
            kind, at = found[0]
            mask = args[at] if kind == "arg" else kwargs[at]
            if id(mask) not in checked:
                checked[id(mask)] = _is_causal_mask(mask)
            if not checked[id(mask)]:
                continue
            args = tuple(None if kind == "arg" and number == at else value for number, value in enumerate(args))
            kwargs = {name: None if kind == "kwarg" and name == at else value for name, value in kwargs.items()}
            store["call"], store["dropped"] = (args, kwargs, version), True

    def result(self, mask: torch.Tensor, causal: bool) -> StackTrace:
        if self.rebuilt:
            held: dict = {}  # the one layer whose records are rebuilt
            layers = [RecomputedLayer(self, index, held) for index in range(len(self.store))]
        else:
            layers = [
                self._layer_record(idx, store, layer_spec)
                for idx, (store, layer_spec) in enumerate(zip(self.store, self.stack.layers, strict=True))
            ]
        final = self.final.get("input")
        final = None if final is None else final.reshape(*mask.shape, -1)
        return StackTrace(layers=layers, mask=mask.bool(), causal=causal, final_norm_input=final)

    def _layer_record(self, idx: int, store: dict, layer_spec: LayerSpec) -> LayerTrace:
        """Block ``idx``'s records (``store``, recorded by this recorder's hooks) as a :class:`LayerTrace`."""
        for key in [key for key in store if key.endswith("norm_input")]:  # OPT flattens before its FFN norm
            if not isinstance(store[key], Unrecorded):
                store[key] = store[key].reshape(*store["input"].shape[:-1], -1)
        if isinstance(layer_spec.self_attn.module, NoMixer):  # it adds nothing to the block's input
            input_ = store["input"]
            store.update(self_mixer_input=input_, self_mixer_mask=None, self_output=torch.zeros_like(input_))
        mixer = "self_mixer_input" in store
        if not mixer and store.get("self_probs") is None:
            raise TraceError(
                f"Layer {idx} returned no attention probabilities. inseq-mixing needs eager attention; "
                "switching failed for this model. Load it with attn_implementation='eager'."
            )
        attn = {"self": self._mixer_record(store)} if mixer else {}
        for name in ("self", "cross"):
            if f"{name}_output" in store and name not in attn:
                probs = store[f"{name}_probs"]
                recomputed = isinstance(probs, ProbsSource)
                attn[name] = AttentionTrace(
                    kept_probs=None if recomputed else probs.detach(),
                    source=probs if recomputed else None,
                    values=store[f"{name}_values"],
                    output=store[f"{name}_output"],
                    norm_input=store.get(f"{name}_norm_input", store["input"]),
                    call=store.get(f"{name}_call"),
                    latent_norm_input=store.get(f"{name}_latent_norm_input"),
                    num_heads=getattr(self.stack.layers[idx], f"{name}_attn").num_heads,
                )
        return LayerTrace(
            input=store["input"],
            output=store["output"],
            self_attn=attn["self"],
            ffn_norm_input=store["output" if isinstance(layer_spec.ffn.forward, NoFFN) else "ffn_norm_input"],
            ffn_out_norm_input=store.get("ffn_out_norm_input"),
            cross_attn=attn.get("cross"),
            ffn_routing=_routing_by_position(store.get("ffn_routing"), store["input"].shape[:-1]),
            injected=self.injected[idx] if idx < len(self.injected) else None,
        )


def _square_mask(value, length: int) -> bool:
    """Whether a call argument is an additive attention mask over ``length`` positions ``(batch, 1, T, T)``."""
    return (isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point()
            and value.shape[1] == 1 and value.shape[-2] == value.shape[-1] == length)  # fmt: skip


def _is_causal_mask(mask: torch.Tensor) -> bool:
    """Whether every row of ``mask`` ``(batch, 1, T, T)`` is the causal mask's (:func:`causal_rows`), read by blocks
    of rows."""
    length = mask.shape[-1]
    step = rows_per_block(mask.shape[0], 1, length)
    for start in range(0, length, step):
        rows = torch.arange(start, min(start + step, length))
        block = mask[:, :, start : start + len(rows)]
        if not torch.equal(block, causal_rows(rows, length, mask.dtype, mask.device).expand_as(block)):
            return False
    return True


class RecomputedLayer:
    """One block's records in a long trace of a decoder-only or encoder-only model: its ``input``, ``output`` and
    ``injected`` are the forward pass's; reading any other :class:`LayerTrace` field runs the block again on its
    recorded input and call with the trace's hooks (:meth:`_Recorder.rerun`: the same module on the same arguments, in
    eager attention, by the same blocks of rows, in eval mode: the same numbers, bit for bit). The layers of a trace
    share one slot holding the last layer rebuilt, so that reading the layers one after another holds one layer's
    records at a time.

    Attributes:
        reruns: How many times this layer was rebuilt.
    """

    def __init__(self, recorder: "_Recorder", index: int, held: dict):
        store = recorder.store[index]
        self.input, self.output = store["input"], store["output"]
        self.injected = recorder.injected[index] if index < len(recorder.injected) else None
        self.reruns = 0
        self._recorder, self._index, self._held = recorder, index, held

    def holds(self) -> list:
        """What this record keeps alive: its input, output and added vectors, its call, and the slot of the one
        layer rebuilt (shared by the trace's layers)."""
        return [self.input, self.output, self.injected, self._recorder.store[self._index].get("call"), self._held]

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not a record (copying, pickling)
            raise AttributeError(name)
        return getattr(self.record(), name)

    def record(self) -> LayerTrace:
        """The layer's whole records, rebuilt unless they are the ones held."""
        if self._held.get("owner") is not self:
            self._held.clear()  # the previous layer's records are freed before this one's are computed
            record = self._recorder.rerun(self._index)
            self.reruns += 1
            self._held.update(owner=self, record=record)
        return self._held["record"]


class _AttentionRecords(dict):
    """One layer's records under ``records="attention"``: the layer's input and output and what recomputes its
    probabilities are kept; any other tensor is dropped as its hook stores it (:class:`Unrecorded`: its shape), a
    mixture's routing too (None)."""

    KEPT = ("input", "output", "self_probs", "cross_probs", "self_call", "cross_call", "self_mixer_input",
            "self_mixer_mask", "self_mixer_rotary", "self_mixer_branches", "self_mixer_extra")  # fmt: skip

    def __setitem__(self, key: str, value) -> None:
        if key not in self.KEPT:
            value = None if key == "ffn_routing" else Unrecorded(key.replace("_", " "), value.shape)
        super().__setitem__(key, value)


def _mixer_call(args: tuple, kwargs: dict) -> tuple:
    """What a token mixer's call gave it that freezing it reads: its input (detached), ``attention_mask`` and
    ``position_embeddings`` (None where not given)."""
    hidden = (args[0] if args else kwargs["hidden_states"]).detach()
    return hidden, kwargs.get("attention_mask"), kwargs.get("position_embeddings")


def _routing_by_position(routing: tuple | None, positions: torch.Size) -> tuple | None:
    """A router's ``(weights, experts)`` ``(N, k)`` laid out by position ``(*positions, k)``."""
    if routing is None:
        return None
    return tuple(tensor.reshape(*positions, tensor.shape[-1]) for tensor in routing)


def _in_call_order(callbacks: list):
    """One hook that passes the k-th call of its module to ``callbacks[k]`` (cycling): a module shared by several
    layers records each call into its own layer, in the order the model calls it."""
    if len(callbacks) == 1:
        return callbacks[0]
    calls = itertools.count()

    def hook(*args):
        return callbacks[next(calls) % len(callbacks)](*args)

    return hook


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Temporarily switch a model to eager attention, which returns attention probabilities."""
    current = model.config._attn_implementation
    if current in (None, "eager"):
        yield
        return
    logger.info("Switching attention from %s to eager for the trace; it is restored afterwards.", current)
    try:
        _set_attn_implementation(model, "eager")
        yield
    finally:
        _set_attn_implementation(model, current)


def _set_attn_implementation(model: nn.Module, implementation: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(implementation)
    else:  # transformers < 4.54
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation"):
                config._attn_implementation = implementation


@contextmanager
def materialized(model: nn.Module) -> Iterator[None]:
    """A model dispatched with offloaded weights (accelerate's CPU or disk offload, ``device_map`` with ``"cpu"`` or
    ``"disk"`` entries) with every offloaded weight loaded on its module's execution device for the duration, and the
    hooks' offloading paused, so that the methods read the weights the forward pass uses (outside a forward pass they
    are ``meta`` tensors); put back as they were afterwards, also on error. Other models: nothing changes.

    What this holds: the offloaded weights, at once (the model in the execution devices' memory for the method's
    duration; disk offload is read back once). Weights already on a device stay where they are."""
    hooks = [(module, module._hf_hook) for module in model.modules() if _offloads(module)]
    if not hooks:
        yield
        return
    # the modules' own tensor objects, put back at the end: tied weights (an embedding shared with the LM head) stay
    # one parameter, whatever the hooks did to each module's copy
    kept = [
        (tensors, dict(tensors)) for module in model.modules() for tensors in (module._parameters, module._buffers)
    ]
    loaded = []
    try:
        for module, hook in hooks:
            hook.pre_forward(module)  # its weights on its execution device
            hook.offload = False  # calls inside keep them there
            loaded.append((module, hook))
        yield
    finally:
        for module, hook in reversed(loaded):
            hook.offload = True
            hook.post_forward(module, None)  # back to meta, the hook's bookkeeping of tied weights emptied
        for tensors, originals in kept:
            tensors.update(originals)


def state_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every entry of the model's ``state_dict``, in order, with the values of the weights accelerate offloads (on the
    ``meta`` device between forward passes) read from where it keeps them (its CPU copy or its files on disk), one at
    a time: the weights a dispatched model's forward pass uses, without loading them all at once."""
    stores = []
    for module in model.modules():
        weights = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        store = getattr(weights, "dataset", weights)  # a prefixed view of the whole offloaded state
        if store is not None and all(store is not other for other in stores):
            stores.append(store)
    first = {}  # a tied weight appears under each of its names, its offloaded copy under one
    state = model.state_dict(keep_vars=True)
    for name, tensor in state.items():
        first.setdefault(id(tensor), name)
    for name, tensor in state.items():
        if tensor.device.type == "meta":
            tensor = _offloaded(stores, name, first[id(tensor)])
        yield name, tensor.detach()


def _offloaded(stores: list, *names: str) -> torch.Tensor:
    for name in names:
        for store in stores:
            if name in store:
                return store[name]
    raise ValueError(
        f"The weight {names[0]!r} is on the meta device and not among the weights accelerate offloaded: load the "
        "model with its weights (a model built on the meta device has none to explain)."
    )


def _offloads(module: nn.Module) -> bool:
    """Whether accelerate offloads the module's weights between its forward passes."""
    hook = getattr(module, "_hf_hook", None)
    return hook is not None and type(hook).__name__ == "AlignDevicesHook" and bool(getattr(hook, "offload", False))


@contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """Temporarily put modules in eval mode (no dropout), restoring each submodule's flag afterwards."""
    flags = {module: module.training for model in models for module in model.modules()}
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


def left_padding_position_ids(mask: torch.Tensor) -> torch.Tensor | None:
    """Position ids that ignore left padding, so a padded sentence is encoded as it would be alone."""
    if bool(mask[:, 0].all()):
        return None
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


#: LM-head weights found finite, by ``id``: a weak reference to the weight and its version (in-place change count)
#: then; checked again only if changed. (Tensors compare elementwise, so they cannot be weak dictionary keys.)
_FINITE_HEAD_WEIGHTS: dict[int, tuple[weakref.ref, int]] = {}


def refuse_non_finite_head(model: nn.Module, spec: ModelSpec) -> None:
    """Refuse NaN or infinite LM-head weights (unembedding, biases) when the head's product is skipped: they would
    have made the full logits non-finite. Each weight is checked once per version, not once per batch."""
    weights = (spec.lm_head.weight, getattr(spec.lm_head, "bias", None), spec.logits_bias)
    for weight in (weight for weight in weights if isinstance(weight, torch.Tensor)):
        known = _FINITE_HEAD_WEIGHTS.get(id(weight))
        if known is not None and known[0]() is weight and known[1] == weight._version:
            continue
        if not all_finite(weight):
            refuse_non_finite_weights(model)
            raise ValueError("The model's logit bias contains NaN or infinite values: repair or reload the model.")
        forget = functools.partial(_FINITE_HEAD_WEIGHTS.pop, id(weight), None)
        _FINITE_HEAD_WEIGHTS[id(weight)] = (weakref.ref(weight, lambda _ref, forget=forget: forget()), weight._version)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite, with no temporary the size of the tensor
    (``torch.isfinite(t).all()`` makes three: 0.45 GB for a GPT-2 unembedding, held at a first call's peak). A NaN or
    infinite value makes the sum non-finite; a non-finite sum of finite values (an overflow) is told apart chunk by
    chunk."""
    tensor = tensor.detach()
    if bool(torch.isfinite(tensor.sum())):
        return True
    return all(bool(torch.isfinite(chunk).all()) for chunk in tensor.reshape(-1).split(2**22))


def refuse_non_finite_weights(model: nn.Module) -> None:
    """Raise, naming them, if the model's weights hold NaN or infinite values."""
    bad = [name for name, param in model.named_parameters() if not all_finite(param)]
    if bad:
        listed = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"The model's weights contain NaN or infinite values ({listed}): repair or reload them.")


def refuse_non_finite_forward(model: nn.Module, logits: torch.Tensor, mask: torch.Tensor) -> None:
    """Name the cause when the forward pass gives NaN or infinite logits (or final hidden states, when the head was
    skipped) at real positions: bad weights, or an overflow. (Padding positions may hold NaN: their attention rows can
    be fully masked.) Inside a :func:`.deferred.one_read` scope, when the scope ends (no host–device synchronisation
    here)."""
    real = mask.bool().reshape(*mask.shape, *[1] * (logits.dim() - mask.dim()))
    check(
        (torch.isfinite(logits) | ~real.to(logits.device)).all(),
        functools.partial(_explain_non_finite_forward, model, mask),
    )


def _explain_non_finite_forward(model: nn.Module, mask: torch.Tensor, finite: int) -> None:
    if finite:
        return
    refuse_non_finite_weights(model)
    dtype = next(model.parameters()).dtype
    if not bool(mask[:, 0].all()):
        raise FloatingPointError(
            f"The model's forward pass gives non-finite logits at real tokens of this left-padded batch in {dtype}: "
            "transformers' attention returns NaN for fully padded rows (most decoder-only models in float64 do), "
            "and it reaches the real tokens. Attribute the sentences one at a time, or run the model in float32."
        )
    if dtype == torch.float64 and not bool(mask.bool().all()):
        raise FloatingPointError(
            f"The model's forward pass gives non-finite logits at real tokens of this padded batch in {dtype}: "
            "transformers' float64 attention masking gives NaN for padded rows (ModernBERT does), and it reaches the "
            "real tokens. Attribute the texts one at a time (the encoder front end does so for ModernBERT in "
            "float64), or run the model in float32."
        )
    if dtype in (torch.float16, torch.bfloat16):
        raise FloatingPointError(
            f"The model's forward pass overflows in {dtype} (non-finite logits): run it in float32 (model.float())."
        )
    raise FloatingPointError(
        f"The model's forward pass gives non-finite logits in {dtype} from finite weights: check the inputs "
        "(e.g. inputs_embeds) and the scale of the weights."
    )


def check_vocabulary(model: nn.Module, *sequences: torch.Tensor | None) -> None:
    """Refuse token ids the model has no embedding for (a tokenizer from another model)."""
    size = model.get_input_embeddings().num_embeddings
    given = [ids for ids in sequences if ids is not None and ids.numel()]
    largest = int(torch.stack([ids.max().to(given[0].device) for ids in given]).max())  # one host read
    if largest >= size:
        raise ValueError(
            f"Token id {largest} is outside the model's vocabulary of {size}: the tokenizer does not match the model. "
            "Load the model's own tokenizer."
        )


def check_lengths(spec: ModelSpec, *sequences: torch.Tensor | None) -> None:
    """Refuse sequences longer than the model's table of position embeddings, before any computation."""
    longest = max(ids.shape[-1] for ids in sequences if ids is not None)
    if spec.max_positions is not None and longest > spec.max_positions:
        raise ValueError(
            f"The input has {longest} tokens, but this {spec.family} model reads {spec.max_positions} at most (its "
            "table of position embeddings, config.max_position_embeddings / n_positions). Shorten or truncate the "
            "input."
        )


def forward_arguments(
    model: nn.Module,
    spec: ModelSpec,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    extra: dict | None = None,
) -> dict:
    """Check the ids and build the keyword arguments of one teacher-forced forward pass (masks filled in, positions
    that ignore left padding, no cache; ``extra`` passed on: an encoder-only model's ``token_type_ids``, a
    vision-language decoder's ``pixel_values``); see :func:`trace_model` for the arguments."""
    if input_ids.numel() == 0:
        raise ValueError("Cannot trace an empty input: pass at least one token.")
    check_lengths(spec, input_ids, decoder_input_ids)
    check_vocabulary(model, input_ids, decoder_input_ids)
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    if spec.is_encoder_only:  # positions are each family's own (RoBERTa's count from its padding index)
        return {"input_ids": input_ids, "attention_mask": attention_mask, **(extra or {})}
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if spec.is_encoder_decoder:
        if decoder_input_ids is None or decoder_input_ids.numel() == 0:
            raise ValueError("Encoder–decoder models need a non-empty target prefix (decoder_input_ids).")
        decoder_attention_mask = (
            torch.ones_like(decoder_input_ids) if decoder_attention_mask is None else decoder_attention_mask
        )
        kwargs.update(decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)
    else:
        position_ids = None if spec.own_positions else left_padding_position_ids(attention_mask)
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        kwargs.update(extra or {})  # a vision-language decoder's images (``pixel_values``)
        refuse_images_without_pixels(spec, input_ids, kwargs)
    return kwargs


def refuse_images_without_pixels(spec: ModelSpec, input_ids: torch.Tensor, kwargs: dict) -> None:
    """Refuse ids holding a vision-language decoder's image tokens without the images: the model would embed the
    placeholder token itself and explain a prediction it never makes (one read of the device)."""
    if spec.image_token_id is None or kwargs.get("pixel_values") is not None:
        return
    count = int((input_ids == spec.image_token_id).sum())
    if count:
        raise ValueError(f"The input holds {count} image token(s) (id {spec.image_token_id}) but no images: pass "
                         "them as extra={'pixel_values': ...} (Inseq's model.attribute cannot pass images "
                         "yet).")  # fmt: skip


def decoder_mask(kwargs: dict) -> torch.Tensor:
    """The mask of the decoder positions in :func:`forward_arguments`' keyword arguments."""
    return kwargs["decoder_attention_mask"] if "decoder_attention_mask" in kwargs else kwargs["attention_mask"]


def trace_model(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    spec: ModelSpec | None = None,
    extra: dict | None = None,
    full_logits: bool = True,
    keep_probs: bool | None = None,
    records: str = "all",
) -> ModelTrace:
    """Run one teacher-forced forward pass and record every layer.

    Args:
        model: A supported Hugging Face model with an LM head, or an encoder-only model (with a head or bare).
        input_ids: Source ids ``(batch, S)`` for encoder–decoders, the whole sequence ``(batch, T)`` for decoder-only
            and encoder-only models.
        attention_mask: Mask of ``input_ids`` (1 for real tokens). Defaults to all ones.
        decoder_input_ids: Target prefix ``(batch, T)`` of encoder–decoders (decoder start token first).
        decoder_attention_mask: Mask of ``decoder_input_ids``. Defaults to all ones.
        spec: The model's spec, if already built.
        extra: Further inputs of the forward pass (an encoder-only model's ``token_type_ids``, a vision-language
            decoder's ``pixel_values``).
        full_logits: Compute the LM head's full-vocabulary logits at every position (``ModelTrace.logits``). False:
            the head's product is skipped (a third of GPT-2-small's forward pass, two fifths of an opus-mt model's);
            the explained logits are read from the final hidden state, which is checked for NaN instead. Encoder-only
            models always keep their head's output.
        keep_probs: Keep every layer's attention probabilities (True), or recompute a layer's when it is read
            (False: :class:`ProbsSource`); None: keep them up to :data:`KEPT_PROBS_BYTES` for the whole trace.
        records: ``"all"``, or ``"attention"``: keep only what attention rollout and flow read (each layer's input,
            output and probabilities; the rest :class:`Unrecorded`). A trace that keeps no probabilities of a
            decoder-only or encoder-only model keeps each layer's input, output and call, and rebuilds these records
            when read (:class:`RecomputedLayer`).

    Returns:
        The recorded :class:`ModelTrace`.
    """
    spec = spec or get_spec(model)
    call = ModelCall(model, forward_arguments(model, spec, input_ids, attention_mask, decoder_input_ids,
                                              decoder_attention_mask, extra))  # fmt: skip
    return trace_call(spec, call, full_logits, keep_probs, records)


def probs_bytes(spec: ModelSpec, call: ModelCall) -> int:
    """The bytes every layer's attention probabilities of a traced call take together (in the model's dtype)."""
    decoder = call.decoder_mask.shape
    encoder = call.encoder_mask.shape if spec.is_encoder_decoder else None
    size = next(call.model.parameters()).element_size()
    total = 0
    for name, stack in spec.stacks.items():
        queries = (encoder if name == "encoder" else decoder)[-1]
        for layer in stack.layers:
            total += layer.self_attn.num_heads * queries * queries
            if layer.cross_attn is not None and encoder is not None:
                total += layer.cross_attn.num_heads * queries * encoder[-1]
    return total * decoder[0] * size


def trace_call(spec: ModelSpec, call: ModelCall, full_logits: bool = True, keep_probs: bool | None = None,
               records: str = "all") -> ModelTrace:  # fmt: skip
    """:func:`trace_model` on prepared forward arguments (text: :func:`forward_arguments`; speech: the speech front
    end's, with the frame masks of the stacks that read audio)."""
    if records not in RECORDS:
        raise ValueError(f"records={records!r}: give one of {RECORDS}.")
    model = call.model
    asked = NEEDS_OUTPUT_ATTENTIONS or spec.output_attentions
    kwargs = {**call.kwargs, "output_attentions": True} if asked else dict(call.kwargs)
    if keep_probs is None:
        keep_probs = probs_bytes(spec, call) <= KEPT_PROBS_BYTES
    slot = None if keep_probs else {}  # the one layer of recomputed probabilities the trace holds
    rebuilt = not keep_probs and not spec.is_encoder_decoder  # a long trace: layers rebuilt when read
    recorders = {
        name: _Recorder(stack, name == "decoder", model, slot, records, rebuilt) for name, stack in spec.stacks.items()
    }
    skip_head = not full_logits and spec.lm_head is not None and not spec.is_encoder_only
    with ExitStack() as hooks:
        hooks.enter_context(eval_mode(model))
        hooks.enter_context(eager_attention(model))
        interfaced: set = set()  # the attention modules that took their eager function from transformers
        if not keep_probs:  # nobody reads the forward's probabilities: its attention runs by blocks of query rows
            hooks.enter_context(eager_in_row_blocks(seen=interfaced))
        for recorder in recorders.values():
            recorder.register(hooks)
        for block in spec.block_modules():
            release = block.register_forward_hook(lambda *_: release_freed_memory())  # the forward's heap holes
            hooks.callback(release.remove)
        head_output = {}
        if skip_head:
            hooks.enter_context(head_skipped(spec.lm_head))
        elif spec.logit_softcap is not None:
            head_hook = spec.lm_head.register_forward_hook(lambda _m, _a, out: head_output.update(logits=out.detach()))
            hooks.callback(head_hook.remove)
        with torch.no_grad():
            output = model(**kwargs)
            if rebuilt:  # the causal mask is made again by rows when a layer is read
                recorders["decoder"].drop_masks(interfaced)
            decoder = recorders["decoder"].result(
                call.decoder_mask, causal=spec.causal and not spec.bidirectional_images
            )
            final_hidden = stack_output(spec.decoder, decoder)
            if spec.is_encoder_only:
                logits, own = None, getattr(output, "logits", None)
                if own is not None and own.dim() == 3:  # masked LMs, token classifiers, CTC: the model's own
                    logits = own.detach()
                elif spec.head is not None:  # a sequence classifier's own logits are its first position's only
                    logits = head_logits(spec.head, final_hidden, mask=call.decoder_mask)
            else:
                logits = None if skip_head else output.logits.detach()
    if logits is not None:
        refuse_non_finite_forward(model, logits, call.decoder_mask)
    elif skip_head:  # what the skipped head would have read, and its weights, checked instead of its logits
        refuse_non_finite_forward(model, final_hidden, call.decoder_mask)
        refuse_non_finite_head(model, spec)
    encoder = recorders.get("encoder")
    return ModelTrace(
        spec=spec,
        decoder=decoder,
        encoder=None if encoder is None else encoder.result(call.encoder_mask, causal=False),
        logits=logits,
        logits_before_softcap=head_output.get("logits"),
        call=call,
        final_hidden=final_hidden,
    )


@contextmanager
def head_skipped(head: nn.Module, store: dict | None = None) -> Iterator[None]:
    """Make the LM head return zeros of its output's shape (a broadcast view: no memory, no product) instead of the
    full-vocabulary logits nobody reads (:func:`replaced_forward`); with ``store``, the hidden states it was given
    are put there (``store["input"]``, graph kept) for the logits that are read to be gathered from them."""
    outputs = head.weight.shape[0]

    def forward(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if store is not None:
            store["input"] = hidden
        return hidden.new_zeros(()).expand(*hidden.shape[:-1], outputs)

    with replaced_forward(head, forward):
        yield


@contextmanager
def replaced_forward(module: nn.Module, forward) -> Iterator[None]:
    """Run ``forward`` in place of a module's own; its own ``forward`` (and any wrapper installed on the instance, such
    as accelerate's device hooks) is put back afterwards, whatever happens."""
    own = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def stack_output(stack_spec: StackSpec, stack: StackTrace) -> torch.Tensor:
    """What a stack hands on: its last block's output, through the final norm if it has one."""
    if stack_spec.final_norm is None:
        return stack.layers[-1].output
    return stack_spec.final_norm(stack.final_norm_input)


def head_logits(head: HeadSpec, hidden: torch.Tensor, detach: bool = True, mask: torch.Tensor | None = None
                ) -> torch.Tensor:  # fmt: skip
    """An encoder head's logits at every position ``(batch, positions, outputs)``: its steps, the model's own modules,
    applied to each position's final hidden state (a sequence classifier's logits are those of position 0); a pooled
    read-out's logits (:meth:`~.specs.HeadSpec.pooled`) at every position. ``detach=False`` keeps the graph (for
    a gradient through the head); ``mask``: the real positions a pooled mean reads (a padded batch)."""
    length = hidden.shape[1]
    hidden = head.pooled(hidden, mask)
    for step in head.steps:
        hidden = step(hidden)
    return (hidden.detach() if detach else hidden).expand(-1, length, -1)
