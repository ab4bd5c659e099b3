"""LFM2 and LFM2-MoE (Liquid AI, 2025): hybrid decoders whose blocks mix tokens with a gated short convolution or, at
the ``full_attention`` layers, with grouped-query attention (q/k norms, RoPE); pre-RMSNorm (``operator_norm``), a
SwiGLU FFN in every block (LFM2-MoE: past its first ``num_dense_layers``, a routed mixture of SwiGLU experts with
sigmoid routing weights, their selection biased by ``expert_bias``), the final norm ``embedding_norm``.

The convolutions are :class:`~.base.MixerSpec` (``kind="lfm2"``): ``out_proj(C_t ⊙ conv(B ⊙ x)_t)`` with its gates
frozen at the traced pass, each token reaching its own position and the next ``L_cache − 1``
(:mod:`inseq_mixing.methods.mixers`; our extension).
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerSpec, ModelSpec, MoESpec, attention, check_experts

FAMILY = "LFM2, LFM2-MoE (short convolution and attention hybrids)"
MODEL_TYPES = {"lfm2", "lfm2_moe"}


def ffn_spec(layer: nn.Module) -> FFNSpec | MoESpec:
    block = layer.feed_forward
    if not hasattr(block, "experts"):
        return FFNSpec(forward=block, norm=layer.ffn_norm, pre_norm=True, w_in=block.w3, w_out=block.w2,
                       activation=nn.functional.silu, w_gate=block.w1)  # fmt: skip
    check_experts(block)  # its experts' activation is a function (F.silu): AttnLRP puts its rule in its place
    return MoESpec(forward=block, norm=layer.ffn_norm, pre_norm=True, router=block.gate, experts=block.experts)


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if layer.is_attention_layer:
        attn = layer.self_attn
        heads = (config.num_attention_heads, config.num_key_value_heads, attn.head_dim)
        mixer = attention(attn, attn.v_proj, attn.out_proj, heads, layer.operator_norm, True)
    else:
        mixer = MixerSpec(module=layer.conv, kind="lfm2", num_heads=1, norm=layer.operator_norm, pre_norm=True)
    return LayerSpec(module=layer, self_attn=mixer, ffn=ffn_spec(layer))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="embedding_norm")
