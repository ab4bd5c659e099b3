"""Nemotron-H (NVIDIA, 2025; Nemotron Nano 2): a hybrid decoder whose blocks hold one sub-block each, a pre-RMSNorm
and its residual sum: a Mamba-2 mixer, grouped-query attention (no position embedding), or an FFN
(``down_proj(relu²(up_proj x))``); the final norm ``norm_f``.

Each block is read as a block of the usual layout whose other sub-block adds nothing: a mixer or attention block has
no FFN (:func:`~.base.no_ffn`), an FFN block no token mixer (:func:`~.base.no_mixer`: no part for any token, the
identity as its map). The Mamba-2 mixers are :class:`~.base.MixerSpec` (``kind="mamba2"``; our extension). Its
mixture-of-experts blocks (Nemotron 3: experts without a gate, behind latent projections) are refused with the reason.
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerSpec, ModelSpec, UnsupportedModelError, attention, no_ffn, no_mixer

FAMILY = "Nemotron-H (Mamba-2, attention and FFN blocks)"
MODEL_TYPES = {"nemotron_h"}


def layer_spec(block: nn.Module, config) -> LayerSpec:
    sub, width = block.mixer, config.hidden_size
    if block.block_type == "linear_attention":
        mixer = MixerSpec(module=sub, kind="mamba2", num_heads=sub.num_heads, norm=block.norm, pre_norm=True)
        return LayerSpec(module=block, self_attn=mixer, ffn=no_ffn(width, sub.out_proj))
    if block.block_type == "full_attention":
        heads = (config.num_attention_heads, config.num_key_value_heads, sub.head_dim)
        mixer = attention(sub, sub.v_proj, sub.o_proj, heads, block.norm, True)
        return LayerSpec(module=block, self_attn=mixer, ffn=no_ffn(width, sub.o_proj))
    if block.block_type == "mlp":
        ffn = FFNSpec(forward=sub, norm=block.norm, pre_norm=True, w_in=sub.up_proj, w_out=sub.down_proj,
                      activation=sub.act_fn)  # fmt: skip
        return LayerSpec(module=block, self_attn=no_mixer(width, sub.down_proj), ffn=ffn)
    raise UnsupportedModelError(
        f"Nemotron-H's {block.block_type} blocks (layer {block.layer_idx}) are not read: its experts have no gate and "
        "sit behind latent projections, which the mixture-of-experts reading does not cover; explain a Nemotron-H "
        "without them (Mamba-2, attention and FFN blocks)."
    )


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="norm_f")
