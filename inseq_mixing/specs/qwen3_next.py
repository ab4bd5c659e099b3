"""Qwen3-Next and Qwen3.5 (Alibaba Qwen, 2025–2026; their text decoders): hybrids whose blocks mix tokens with a Gated
DeltaNet layer (linear attention with the delta rule) or, every fourth layer, with gated softmax attention; pre-RMSNorm
with gains ``1 + weight``, an FFN that is a routed mixture of experts with a sigmoid-gated shared expert (Qwen3-Next,
Qwen3.5-MoE) or a dense SwiGLU (Qwen3.5).

Both token mixers are :class:`~.base.MixerSpec`:

- ``kind="gated_deltanet"``: the delta rule unrolled into one exact mixing matrix per value head, its queries, keys,
  steps ``β`` and decays ``α`` frozen at the traced pass;
- ``kind="gated_attention"``: ``o_proj(σ(g_t) ⊙ Σ_h α^h_tj v^h_j)``, softmax attention whose output is gated per query
  position and channel by ``σ(g_t)`` (``g`` from the query projection's second half). The gate depends on the row, so
  a token's part is no longer its value through ``o_proj`` times a probability: read as a mixer, the probabilities and
  the gate frozen at the pass, each token's part is exact (:mod:`inseq_mixing.methods.mixers`).

Our extension: the methods' papers treat neither layer. The vision tower of Qwen3.5's conditional-generation model is
issue 56's (not read here): its text decoder, ``Qwen3_5ForCausalLM``, is.
"""

from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

from . import llama, mixture
from .base import UNIT_OFFSET_RMS_NORMS, LayerSpec, MixerSpec, ModelSpec

FAMILY = "Qwen3-Next and Qwen3.5 (Gated DeltaNet and gated attention hybrids)"
MODEL_TYPES = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}

UNIT_OFFSET_RMS_NORMS.update({Qwen3NextRMSNorm, Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm})


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if layer.block_type == "linear_attention":
        module, kind, heads = layer.linear_attn, "gated_deltanet", layer.linear_attn.num_v_heads
    else:
        module, kind, heads = layer.self_attn, "gated_attention", config.num_attention_heads
    mixer = MixerSpec(module=module, kind=kind, num_heads=heads, norm=layer.input_layernorm, pre_norm=True)
    return LayerSpec(module=layer, self_attn=mixer, ffn=mixture.ffn_spec(layer))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec)
