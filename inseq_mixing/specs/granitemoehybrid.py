"""Granite 4 hybrid (IBM, 2025; ``GraniteMoeHybridForCausalLM``): a hybrid decoder whose blocks mix tokens with a
Mamba-2 layer or, at the ``attention`` layers, with grouped-query attention (RoPE or none), each branch's output
multiplied by ``residual_multiplier`` before its residual sum; pre-RMSNorm; an FFN that is a shared SwiGLU FFN, plus a
routed mixture of SwiGLU experts where the model has experts (their outputs added).

The multipliers: ``embedding_multiplier`` scales the embeddings before the first block (the methods attribute that
block's input); ``attention_multiplier`` is attention's scale, inside the recorded probabilities; the residual
multiplier is a :class:`~.base.LayerScale` on each branch's output (every channel's, as a norm without statistics:
:func:`~.base.multiplier`); ``logits_scaling`` divides the logits (:attr:`~.base.ModelSpec.logits_scale`). The Mamba-2
layers are :class:`~.base.MixerSpec` (``kind="mamba2"``; our extension).
"""

from torch import nn

from . import llama
from .base import (
    FFNSpec,
    LayerSpec,
    MixerSpec,
    ModelSpec,
    MoESpec,
    SlicedLinear,
    SummedModules,
    attention,
    check_experts,
    multiplier,
)

FAMILY = "Granite 4 hybrid (Mamba-2 and attention, multipliers, mixture of experts)"
MODEL_TYPES = {"granitemoehybrid"}


def shared_ffn(mlp: nn.Module, norm: nn.Module | None, out_norm: nn.Module | None = None) -> FFNSpec:
    """The shared FFN, ``output_linear(act(x W_g) ⊙ x W_in)`` with ``W_g``, ``W_in`` the halves of ``input_linear``."""
    width = mlp.output_linear.in_features
    gate, linear = SlicedLinear(mlp.input_linear, slice(0, width)), SlicedLinear(mlp.input_linear, slice(width, None))
    return FFNSpec(forward=mlp, norm=norm, pre_norm=True, w_in=linear, w_out=mlp.output_linear,
                   activation=mlp.activation, w_gate=gate, out_norm=out_norm)  # fmt: skip


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    """A block of Granite 4 hybrid, or of the Granite-MoE attention decoders (:mod:`.granitemoe`: no Mamba-2 layers,
    the shared FFN optional)."""
    width, scale = config.hidden_size, config.residual_multiplier
    if getattr(layer, "mamba", None) is not None:
        mixer = layer.mamba
        branch = MixerSpec(module=mixer, kind="mamba2", num_heads=mixer.num_heads, norm=layer.input_layernorm,
                           pre_norm=True, out_norm=multiplier(scale, width, mixer.out_proj))  # fmt: skip
    else:
        attn = layer.self_attn
        heads = (config.num_attention_heads, config.num_key_value_heads, attn.head_dim)
        branch = attention(attn, attn.v_proj, attn.o_proj, heads, layer.input_layernorm, True,
                           out_norm=multiplier(scale, width, attn.o_proj))  # fmt: skip
    shared, norm, moe = getattr(layer, "shared_mlp", None), layer.post_attention_layernorm, layer.block_sparse_moe
    if moe is None:
        ffn = shared_ffn(shared, norm, multiplier(scale, width, shared.output_linear, shared))
    elif shared is None:  # experts alone (Granite-MoE)
        check_experts(moe)
        ffn = MoESpec(forward=moe, norm=norm, pre_norm=True, router=moe.router, experts=moe.experts,
                      out_norm=multiplier(scale, width, moe.experts, moe))  # fmt: skip
    else:
        check_experts(moe)
        ffn = MoESpec(forward=SummedModules(moe, shared), norm=norm, pre_norm=True, router=moe.router,
                      experts=moe.experts, shared=shared_ffn(shared, None),
                      out_norm=multiplier(scale, width, shared.output_linear, (moe, shared)))  # fmt: skip
    return LayerSpec(module=layer, self_attn=branch, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, logits_scale=1.0 / model.config.logits_scaling, scale_after_head=True)
