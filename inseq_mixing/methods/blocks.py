"""Shared block algebra: per-head value outputs, score masks, and re-applying the position-wise rest of a block on
batched tensors with the model's own submodules.

After an attention sub-block, everything in a Transformer block acts on one position at a time: the residual sum,
the layer norms, the FFN, and (in decoders) the cross-attention, whose queries come from that position only and whose
keys and values come from the unchanged encoder output. So the effect of any change to the attention output of a
position can be computed by pushing the changed vectors, batched, through these functions.
"""

import contextlib
import functools
from collections.abc import Iterator

import numpy as np
import torch
from transformers.activations import NewGELUActivation

from ..deferred import check
from ..specs import AttentionSpec, FFNSpec, LayerSpec, ModelSpec
from ..trace import AttentionTrace, LayerTrace, replaced_forward


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in the precision scores accumulate in: float64 stays, anything else becomes float32."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def refuse_non_finite(method: str, *tensors: torch.Tensor | None) -> None:
    """Raise instead of returning NaN or infinite scores (overflowing half-precision activations); inside a
    :func:`..deferred.one_read` scope, when the scope ends (no host–device synchronisation here)."""
    for tensor in tensors:
        if tensor is not None:
            check(torch.isfinite(tensor).all(), functools.partial(_finite_or_raise, method))


def _finite_or_raise(method: str, finite: int) -> None:
    if not finite:
        raise FloatingPointError(
            f"{method} produced non-finite scores: the model's activations overflow. In float16, run the model in "
            "float32 or bfloat16 (model.float()) and retry; in float32 or float64, check the weights and inputs."
        )


def host_copies(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """CPU copies of small integer or boolean device tensors (masks), in one device-to-host copy: one synchronisation
    for all of them, where a layout found from device values would read the device once per decision."""
    flat = torch.cat([tensor.reshape(-1).to(torch.long) for tensor in tensors]).cpu()
    pieces = flat.split([tensor.numel() for tensor in tensors])
    return [piece.reshape(tensor.shape).to(tensor.dtype) for piece, tensor in zip(pieces, tensors, strict=True)]


def on_device(indices: np.ndarray, device: torch.device) -> torch.Tensor:
    """An index array found on the host, as an int64 tensor on ``device``: a host-to-device copy that does not wait
    for the device's queue (``non_blocking``), so no synchronisation."""
    return torch.from_numpy(np.array(indices, dtype=np.int64)).to(device, non_blocking=True)  # a copy: tiny, writable


def head_value_outputs(attn: AttentionSpec, record: AttentionTrace) -> torch.Tensor:
    """Each head's output-projected value vector :math:`v^h_j W^h_O`, ``(batch, heads, keys, d_model)``."""
    values = record.values[:, :, attn.kv_head_of_query_head().to(record.values.device)]
    return torch.einsum("bkhe,hed->bhkd", upcast(values), upcast(attn.out_weight_per_head()))


def valid_cells(query_mask: torch.Tensor, key_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """``(batch, queries, keys)`` mask of cells that can carry a score: real tokens, and no future keys if causal."""
    valid = query_mask[:, :, None] & key_mask[:, None, :]
    if causal:
        valid = valid & torch.ones(valid.shape[-2:], dtype=torch.bool, device=valid.device).tril()
    return valid


def branch_input(sub_block: AttentionSpec | FFNSpec, hidden: torch.Tensor) -> torch.Tensor:
    """The input of a sub-block's branch: through its input norm, if it has one."""
    return hidden if sub_block.in_norm is None else sub_block.in_norm(hidden)


def close_branch(sub_block: AttentionSpec | FFNSpec, residual: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """Residual sum after a branch (its output normalised first when the sub-block has an output norm), followed by
    the post-sum norm, if any."""
    hidden = residual + (output if sub_block.out_norm is None else sub_block.out_norm(output))
    return hidden if sub_block.post_norm is None else sub_block.post_norm(hidden)


def apply_ffn(ffn: FFNSpec, hidden: torch.Tensor) -> torch.Tensor:
    """The whole FFN sub-block, residual and norms included (its input made contiguous: a mixture of experts views
    its rows flat)."""
    return close_branch(ffn, hidden, ffn.forward(branch_input(ffn, hidden).contiguous()))


def cross_attention_input(layer: LayerSpec, record: LayerTrace) -> torch.Tensor:
    """The clean residual stream entering the cross-attention sub-block (read from the recorded norm inputs)."""
    post_norm = layer.self_attn.post_norm
    return record.cross_attn.norm_input if post_norm is None else post_norm(record.self_attn.norm_input)


def ffn_input(layer: LayerSpec, record: LayerTrace) -> torch.Tensor:
    """The clean residual stream entering the FFN sub-block (read from the recorded norm inputs)."""
    if layer.ffn.post_norm is None:  # the recorded input of its input norm, or of the FFN itself
        return record.ffn_norm_input
    last, last_record = (
        (layer.self_attn, record.self_attn) if layer.cross_attn is None else (layer.cross_attn, record.cross_attn)
    )
    return last.post_norm(last_record.norm_input)


def ffn_output(layer: LayerSpec, record: LayerTrace) -> torch.Tensor:
    """What the FFN branch added to the residual stream (before the norm, in post-LN blocks)."""
    total = record.output if layer.ffn.post_norm is None else record.ffn_norm_input
    if layer.ffn.parallel:  # the block output is input + attention + FFN
        return total - record.input - record.self_attn.output
    return total - ffn_input(layer, record)


def finish_layer(
    layer: LayerSpec,
    record: LayerTrace,
    sub_block: str,
    residual: torch.Tensor,
    attn_output: torch.Tensor,
    batch_index: torch.Tensor,
    queries: slice,
    before_ffn: bool = False,
) -> torch.Tensor:
    """Layer output given a (changed) attention output of one of its attention sub-blocks (with ``before_ffn``: the
    residual stream entering the FFN sub-block, for a caller that runs the FFN itself).

    Args:
        layer: The layer's spec.
        record: The layer's trace (for re-running cross-attention).
        sub_block: ``"self"`` or ``"cross"``: which attention output ``attn_output`` replaces.
        residual: Residual stream entering that sub-block ``(rows, len(queries), d_model)``.
        attn_output: The attention output ``(rows, len(queries), d_model)``.
        batch_index: Recorded batch element of each row.
        queries: Recorded query positions the rows hold.
    """
    attn = layer.self_attn if sub_block == "self" else layer.cross_attn
    hidden = close_branch(attn, residual, attn_output)
    if sub_block == "self" and layer.cross_attn is not None:
        query_states = branch_input(layer.cross_attn, hidden)
        cross_out = record.cross_attn.rerun(layer.cross_attn.module, query_states, batch_index, queries)
        hidden = close_branch(layer.cross_attn, hidden, cross_out)
    if before_ffn:
        return hidden
    if layer.ffn.parallel:  # the FFN read the block input: its output does not change
        return hidden + ffn_output(layer, record)[batch_index][:, queries].to(hidden.dtype)
    return apply_ffn(layer.ffn, hidden)


def fused_gelu(input: torch.Tensor) -> torch.Tensor:
    """The tanh-approximated GELU as torch's one fused kernel (same formula as ``gelu_new``)."""
    return torch.nn.functional.gelu(input, approximate="tanh")


@contextlib.contextmanager
def fused_activations(spec: ModelSpec) -> Iterator[None]:
    """Run the FFNs' tanh-approximated GELU written in Python (transformers' ``NewGELUActivation``: GPT-2's and T5
    v1.1's ``gelu_new``, five element-wise passes over the FFN's hidden rows) as torch's fused kernel of the same
    formula, ``gelu(approximate="tanh")`` (equal to float rounding: 5e-7 at most for inputs of size 16), where an
    activation runs over many rows (value zeroing's corrupted rows, DecompX's slopes). Each module's own ``forward``
    (and any wrapper on the instance) is put back on exit."""
    stacks = [stack for stack in (spec.decoder, spec.encoder) if stack is not None]
    modules = {id(act): act for stack in stacks for layer in stack.layers for act in layer.ffn.activations}
    with contextlib.ExitStack() as replaced:
        for module in modules.values():
            if type(module) is NewGELUActivation:
                replaced.enter_context(replaced_forward(module, fused_gelu))
        yield
