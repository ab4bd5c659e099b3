"""Zamba (Zyphra, 2024; Glorioso et al., *Zamba: A Compact 7B SSM Hybrid Model*): a Mamba decoder in which every few
blocks a shared attention block reads the block's input concatenated with the token embeddings, and its output,
through a linear map, is added to the Mamba mixer's input (Zamba 2's layout, :mod:`.zamba2`, without its adapters and
rotary embeddings, over Mamba's selective scan instead of Mamba-2).

Its Mamba layers are a selective scan split into heads, each with its own step and state projections (``kind=
"mamba_heads"``: one ``T × T`` mixing matrix per channel, :meth:`~inseq_mixing.methods.mixers.FrozenMixer.mamba_heads`;
our extension); its hybrid blocks are one mixer to the methods (:class:`~.base.SharedAttention`), a token's part exact
with the norms, probabilities, FFN gate and mixer frozen (our extension). Value zeroing refuses both (a selective
scan's steps read the values' channels). A selective scan's mixing is ``channels × T²`` a layer: short inputs only on
a CPU.
"""

from torch import nn

from . import llama
from .base import AdaptedLinear, FFNSpec, LayerSpec, MixerSpec, ModelSpec, SharedAttention, no_ffn

FAMILY = "Zamba (Mamba with a shared attention block over the embeddings)"
MODEL_TYPES = {"zamba"}


def mamba_spec(decoder: nn.Module) -> MixerSpec:
    mixer = decoder.mamba
    return MixerSpec(module=mixer, kind="mamba_heads", num_heads=mixer.intermediate_size,
                     norm=decoder.input_layernorm, pre_norm=True)  # fmt: skip


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    if not hasattr(layer, "shared_transf"):  # a Mamba block
        mixer = mamba_spec(layer)
        return LayerSpec(module=layer, self_attn=mixer, ffn=no_ffn(config.hidden_size, mixer.module.out_proj))
    shared, decoder = layer.shared_transf, layer.mamba_decoder
    attention, mlp = shared.self_attn, shared.feed_forward
    ffn = FFNSpec(forward=mlp, norm=shared.pre_ff_layernorm, pre_norm=True, w_in=mlp.up_proj, w_out=mlp.down_proj,
                  activation=mlp.act_fn, w_gate=mlp.gate_proj)  # fmt: skip
    module = SharedAttention(
        block=layer, attention=attention, query=AdaptedLinear(attention.q_proj, None),
        key=AdaptedLinear(attention.k_proj, None), value=AdaptedLinear(attention.v_proj, None),
        attention_norm=shared.input_layernorm, ffn=ffn, projection=layer.linear, mixer=mamba_spec(decoder),
        embeddings="original_hidden_states", rotary=False,
    )  # fmt: skip
    mixer = MixerSpec(module=module, kind="shared_attention", num_heads=decoder.mamba.intermediate_size, norm=None,
                      pre_norm=True)  # fmt: skip
    return LayerSpec(module=layer, self_attn=mixer, ffn=no_ffn(config.hidden_size, decoder.mamba.out_proj))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="final_layernorm")
