"""Mamba, Mamba-2 and Falcon-Mamba (Gu & Dao 2023; Dao & Gu 2024; TII 2024): attention-free decoders whose blocks are
a pre-RMSNorm and a token mixer with its residual sum, no FFN (:func:`~.base.no_ffn`: the methods read an FFN that
adds nothing); the final norm ``norm_f``.

The mixers are :class:`~.base.MixerSpec`: Mamba's and Falcon-Mamba's selective scans (``kind="mamba"``: one mixing
matrix per channel, Falcon-Mamba's weightless norms on the steps and state projections applied when it is frozen),
Mamba-2's SSD (``kind="mamba2"``: one per head), with their steps, decays and gates frozen at the traced pass
(:mod:`inseq_mixing.methods.mixers`; our extension). Value zeroing refuses the selective scans (zeroing a value
changes their steps too). A selective scan's mixing is ``channels × T²`` a layer: short inputs only on a CPU.
"""

from torch import nn

from . import llama
from .base import LayerSpec, MixerSpec, ModelSpec, no_ffn

FAMILY = "Mamba, Mamba-2, Falcon-Mamba (state-space decoders without attention)"
MODEL_TYPES = {"mamba", "mamba2", "falcon_mamba"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mixer = layer.mixer
    selective = not hasattr(mixer, "num_heads")  # Mamba's scan: every channel its own mixing
    heads = mixer.intermediate_size if selective else mixer.num_heads
    spec = MixerSpec(module=mixer, kind="mamba" if selective else "mamba2", num_heads=heads, norm=layer.norm,
                     pre_norm=True)  # fmt: skip
    return LayerSpec(module=layer, self_attn=spec, ffn=no_ffn(config.hidden_size, mixer.out_proj))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, final_norm="norm_f")
