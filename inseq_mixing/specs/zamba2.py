"""Zamba 2 (Zyphra, 2024; Glorioso et al., *The Zamba2 Suite: Technical Report*): a Mamba-2 decoder in which every few
blocks a shared attention block reads the block's input concatenated with the token embeddings, and its output,
through a linear map, is added to the Mamba-2 mixer's input (not to the residual stream).

Plain blocks are a pre-RMSNorm and a Mamba-2 mixer with its residual sum, no FFN (:func:`~.base.no_ffn`). A hybrid
block ``y = x + mamba(norm₃(x + P·ffn(norm₂(attention(norm₁([x; e]))))))`` is one mixer the methods read
(:class:`~.base.SharedAttention`, ``kind="shared_attention"``): the shared block's attention (its queries, keys and
values the shared projections plus this block's adapters, :class:`~.base.AdaptedLinear`; heads of ``2·d/H``
channels, scores scaled by ``(head_dim/2)^{-1/2}``, rotary where ``use_mem_rope``), its gated FFN (the gate frozen
at the traced pass) and the Mamba-2 mixer written as one exact linear map of the block's input and the embeddings
(:class:`~inseq_mixing.methods.mixers.SharedAttentionMixing`; our extension). The embeddings' path is credited to
each token, as its own embedding is. Value zeroing refuses these blocks (zeroing a value changes the Mamba-2
mixer's own input). The shared blocks' weights are tied across blocks in the checkpoints; the spec reads each
block's own modules, whatever their tying. Zamba (the first version) is
:mod:`.zamba`.
"""

from torch import nn

from . import llama
from .base import AdaptedLinear, FFNSpec, LayerSpec, MixerSpec, ModelSpec, SharedAttention, no_ffn

FAMILY = "Zamba 2 (Mamba-2 with shared attention blocks over the embeddings)"
MODEL_TYPES = {"zamba2"}


def mamba_spec(decoder: nn.Module) -> MixerSpec:
    mixer = decoder.mamba
    return MixerSpec(module=mixer, kind="mamba2", num_heads=mixer.num_heads, norm=decoder.input_layernorm,
                     pre_norm=True)  # fmt: skip


def adapted(attention: nn.Module, name: str, index: int) -> AdaptedLinear:
    """The call's projection ``name`` (``q``, ``k``, ``v``) of the shared attention: its shared weight plus the
    adapter of block ``index``, where the model has adapters."""
    if not attention.config.use_shared_attention_adapter:
        return AdaptedLinear(getattr(attention, f"{name}_proj"), None)
    adapter = getattr(attention, f"linear_{name}_adapter_list")[attention.layer_dic[index]]
    return AdaptedLinear(getattr(attention, f"{name}_proj"), adapter)


def shared_ffn(shared: nn.Module, index: int) -> FFNSpec:
    """The shared block's gated FFN at block ``index``: the fused gate/up projection plus the block's adapter,
    split."""
    mlp = shared.feed_forward
    adapter = mlp.gate_up_proj_adapter_list[mlp.layer_dic[index]]
    adapter = adapter if isinstance(adapter, nn.Sequential) else None
    width = mlp.down_proj.in_features
    gate, up = (AdaptedLinear(mlp.gate_up_proj, adapter, part) for part in (slice(0, width), slice(width, None)))
    return FFNSpec(forward=mlp, norm=shared.pre_ff_layernorm, pre_norm=True, w_in=up, w_out=mlp.down_proj,
                   activation=mlp.act_fn, w_gate=gate)  # fmt: skip


def layer_spec(layer: nn.Module, index: int, config) -> LayerSpec:
    if not hasattr(layer, "shared_transformer"):  # a Mamba-2 block
        mixer = mamba_spec(layer)
        return LayerSpec(module=layer, self_attn=mixer, ffn=no_ffn(config.hidden_size, mixer.module.out_proj))
    shared, decoder = layer.shared_transformer, layer.mamba_decoder
    attention = shared.self_attn
    module = SharedAttention(
        block=layer, attention=attention, query=adapted(attention, "q", index), key=adapted(attention, "k", index),
        value=adapted(attention, "v", index), attention_norm=shared.input_layernorm, ffn=shared_ffn(shared, index),
        projection=layer.linear, mixer=mamba_spec(decoder), embeddings="original_hidden_states",
        rotary=config.use_mem_rope,
    )  # fmt: skip
    mixer = MixerSpec(module=module, kind="shared_attention", num_heads=decoder.mamba.num_heads, norm=None,
                      pre_norm=True)  # fmt: skip
    return LayerSpec(module=layer, self_attn=mixer, ffn=no_ffn(config.hidden_size, decoder.mamba.out_proj))


def build(model: nn.Module) -> ModelSpec:
    base = model.base_model
    return llama.build(model, lambda layer, config: layer_spec(layer, list(base.layers).index(layer), config),
                       final_norm="final_layernorm")  # fmt: skip
