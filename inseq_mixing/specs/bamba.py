"""Bamba (IBM, 2025): a hybrid decoder whose blocks mix tokens with a Mamba-2 layer, or, at ``attn_layer_indices``,
with Llama-style grouped-query attention; pre-RMSNorm, a SwiGLU FFN in every block.

The Mamba-2 layers are :class:`~.base.MixerSpec` (``kind="mamba2"``): written as exact mixing matrices with their
steps, decays, gates and norm frozen at the traced pass (:mod:`inseq_mixing.methods.mixers`; our extension).
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerSpec, ModelSpec
from .llama import attention_spec

FAMILY = "Bamba (Mamba-2 and attention hybrid)"
MODEL_TYPES = {"bamba"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if layer.block_type == "linear_attention":
        mixer = MixerSpec(module=layer.mamba, kind="mamba2", num_heads=layer.mamba.num_heads,
                          norm=layer.input_layernorm, pre_norm=True)  # fmt: skip
    else:
        mixer = attention_spec(layer, config, layer.self_attn.v_proj)
    mlp = layer.feed_forward
    ffn = FFNSpec(forward=mlp, norm=layer.pre_ff_layernorm, pre_norm=True, w_in=mlp.up_proj, w_out=mlp.down_proj,
                  activation=mlp.act_fn, w_gate=mlp.gate_proj)  # fmt: skip
    return LayerSpec(module=layer, self_attn=mixer, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="final_layernorm")
