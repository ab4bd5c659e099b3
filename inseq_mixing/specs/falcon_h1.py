"""Falcon-H1 (TII, 2025): a hybrid decoder whose every block mixes tokens with a Mamba-2 mixer and grouped-query
attention side by side on the same normed input, their outputs added; pre-RMSNorm, a SwiGLU FFN.

The two token mixers are one :class:`~.base.ParallelMixers` (``kind="parallel"``): the Mamba-2 mixer written as an
exact mixing matrix with its steps, decays, gate and (optional) gated norm frozen at the traced pass, attention read
through its probabilities, a token's part the sum of its parts in both (:mod:`inseq_mixing.methods.mixers`; our
extension). Its μP multipliers, each where the model applies it: ``embedding_multiplier`` before the first block (the
methods attribute that block's input); ``ssm_in_multiplier`` and the per-channel ``mup_vector`` inside the Mamba-2
mixer; ``attention_in_multiplier`` and ``key_multiplier`` on attention's input and keys (inside the recorded
probabilities; the values' map times the first); ``ssm_out_multiplier`` and ``attention_out_multiplier`` on the
branches' outputs (:class:`~.base.MixerBranch`); ``mlp_multipliers`` on the FFN's gate and down projections
(:class:`~.base.ScaledLinear`); ``lm_head_multiplier`` on the logits (:attr:`~.base.ModelSpec.logits_scale`).
"""

from torch import nn

from . import llama
from .base import FFNSpec, LayerSpec, MixerBranch, MixerSpec, ModelSpec, ParallelMixers, ScaledLinear

FAMILY = "Falcon-H1 (Mamba-2 and attention in parallel, multipliers)"
MODEL_TYPES = {"falcon_h1"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mamba, attn = layer.mamba, layer.self_attn
    branches = (
        MixerBranch(MixerSpec(module=mamba, kind="mamba2", num_heads=mamba.num_heads, norm=None, pre_norm=True),
                    out_scale=layer.ssm_out_multiplier),
        MixerBranch(MixerSpec(module=attn, kind="attention", num_heads=config.num_attention_heads, norm=None,
                              pre_norm=True),
                    in_scale=layer.attention_in_multiplier, out_scale=layer.attn_out_multiplier),
    )  # fmt: skip
    heads = sum(branch.spec.num_heads for branch in branches)
    mixer = MixerSpec(module=ParallelMixers(*branches), kind="parallel", num_heads=heads, norm=layer.input_layernorm,
                      pre_norm=True)  # fmt: skip
    mlp = layer.feed_forward
    ffn = FFNSpec(forward=mlp, norm=layer.pre_ff_layernorm, pre_norm=True, w_in=mlp.up_proj,
                  w_out=ScaledLinear(mlp.down_proj, mlp.down_multiplier), activation=mlp.act_fn,
                  w_gate=ScaledLinear(mlp.gate_proj, mlp.gate_multiplier))  # fmt: skip
    return LayerSpec(module=layer, self_attn=mixer, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="final_layernorm",
                       logits_scale=model.config.lm_head_multiplier, scale_after_head=True)  # fmt: skip
