"""LFM2 (Liquid AI, 2025): a hybrid decoder whose blocks mix tokens with a gated short convolution or, at the
``full_attention`` layers, with grouped-query attention (q/k norms, RoPE); pre-RMSNorm (``operator_norm``), a SwiGLU
FFN in every block, the final norm ``embedding_norm``.

The convolutions are :class:`~.base.MixerSpec` (``kind="lfm2"``): ``out_proj(C_t ⊙ conv(B ⊙ x)_t)`` with its gates
frozen at the traced pass, each token reaching its own position and the next ``L_cache − 1``
(:mod:`inseq_mixing.methods.mixers`; our extension).
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerSpec, ModelSpec, attention

FAMILY = "LFM2 (short convolution and attention hybrid)"
MODEL_TYPES = {"lfm2"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if layer.is_attention_layer:
        attn = layer.self_attn
        heads = (config.num_attention_heads, config.num_key_value_heads, attn.head_dim)
        mixer = attention(attn, attn.v_proj, attn.out_proj, heads, layer.operator_norm, True)
    else:
        mixer = MixerSpec(module=layer.conv, kind="lfm2", num_heads=1, norm=layer.operator_norm, pre_norm=True)
    mlp = layer.feed_forward
    ffn = FFNSpec(forward=mlp, norm=layer.ffn_norm, pre_norm=True, w_in=mlp.w3, w_out=mlp.w2,
                  activation=nn.functional.silu, w_gate=mlp.w1)  # fmt: skip
    return LayerSpec(module=layer, self_attn=mixer, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="embedding_norm")
