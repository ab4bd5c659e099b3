"""OPT: learned absolute positions (offset 2), LayerNorm blocks, pre-LN (125m, 1.3b and larger) or post-LN (350m).

The FFN is not a module of its own (``fc1``, ``activation_fn``, ``fc2`` sit on the block), and its norm sees the
hidden states flattened to ``(batch · positions, d)``; the trace records them as ``(batch, positions, d)``. The
post-LN 350m model maps embeddings up with ``project_in`` (before the first block, so inside its recorded input) and
back down with ``project_out`` before the LM head (the spec's ``readout_proj``).
"""

from torch import nn

from . import bart
from .base import ModelSpec, StackSpec

FAMILY = "OPT"
MODEL_TYPES = {"opt"}


def build(model: nn.Module) -> ModelSpec:
    """OPT blocks are laid out as BART's decoder blocks without cross-attention."""
    decoder, pre_norm = model.get_decoder(), model.config.do_layer_norm_before
    return ModelSpec(
        family="opt",
        decoder=StackSpec(
            layers=[bart.layer_spec(layer, pre_norm) for layer in decoder.layers],
            final_norm=decoder.final_layer_norm,
        ),
        lm_head=model.get_output_embeddings(),
        max_positions=model.config.max_position_embeddings,
        readout_proj=decoder.project_out,
    )
