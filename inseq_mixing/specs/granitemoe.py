"""Granite-MoE and Granite-MoE-Shared (IBM, 2024–2025; ``GraniteMoeForCausalLM``, ``GraniteMoeSharedForCausalLM``):
Llama-style grouped-query attention decoders whose FFN is a routed mixture of SwiGLU experts (Granite-MoE-Shared: plus
a shared SwiGLU FFN where ``shared_intermediate_size`` is not 0, their outputs added), with Granite's multipliers. The
blocks are Granite 4 hybrid's attention blocks (:mod:`.granitemoehybrid`): the embeddings' multiplier before the first
block (the methods attribute that block's input), attention's inside the recorded probabilities, the residual
multiplier as a layer scale on each branch's output, the logits' divisor as the head's scale (after the head). The
routing is frozen at the traced pass, as for every mixture. The sliding-window variant (``granitemoe_swa``) is
refused: its sinks scale the attention output after the softmax, and the probabilities its attention returns leave
that scale out.
"""

from torch import nn

from . import granitemoehybrid
from .base import ModelSpec

FAMILY = "Granite-MoE (attention, multipliers, mixture of experts)"
MODEL_TYPES = {"granitemoe", "granitemoeshared"}


def build(model: nn.Module) -> ModelSpec:
    return granitemoehybrid.build(model)
