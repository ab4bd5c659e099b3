"""Jamba (AI21, 2024): a hybrid decoder whose blocks mix tokens with a Mamba (selective scan) layer or, every
``attn_layer_period`` layers, with grouped-query attention (no position embedding); pre-RMSNorm, a SwiGLU FFN that is
a routed mixture of experts every ``expert_layer_period`` layers.

The Mamba layers are :class:`~.base.MixerSpec` (``kind="mamba"``): one mixing matrix per channel, with the steps and
the state projections (and Jamba's norms on them) frozen at the traced pass (:mod:`inseq_mixing.methods.mixers`; our
extension). Value zeroing refuses them (zeroing a value changes the steps too). The mixing is ``channels × T²`` a
layer: short inputs only on a CPU.
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerSpec, ModelSpec, MoESpec, check_experts

FAMILY = "Jamba (Mamba and attention hybrid, mixture of experts)"
MODEL_TYPES = {"jamba"}


def ffn_spec(layer: nn.Module) -> FFNSpec | MoESpec:
    block = layer.feed_forward
    if not hasattr(block, "experts"):
        return FFNSpec(forward=block, norm=layer.pre_ff_layernorm, pre_norm=True, w_in=block.up_proj,
                       w_out=block.down_proj, activation=block.act_fn, w_gate=block.gate_proj)  # fmt: skip
    check_experts(block, own_gate=True)  # its experts' own loop computes the default gate, act(gate) ⊙ up
    return MoESpec(forward=block, norm=layer.pre_ff_layernorm, pre_norm=True, router=block.router,
                   experts=block.experts)  # fmt: skip


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if hasattr(layer, "mamba"):
        mixer = MixerSpec(module=layer.mamba, kind="mamba", num_heads=layer.mamba.intermediate_size,
                          norm=layer.input_layernorm, pre_norm=True)  # fmt: skip
    else:
        mixer = llama.attention_spec(layer, config, layer.self_attn.v_proj)
    return LayerSpec(module=layer, self_attn=mixer, ffn=ffn_spec(layer))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="final_layernorm")
