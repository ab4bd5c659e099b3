"""Gemma 2 and Gemma 3 text models: Gemma's unit-offset RMSNorms in a sandwich around each sub-block.

Each residual branch is ``x + post(f(pre(x)))``: the input norm of the Llama layout plus a norm on the branch output
(``post_attention_layernorm`` after attention, ``post_feedforward_layernorm`` after the FFN). The attention logit
soft-cap, the sliding-window layers and Gemma 3's q/k norms act inside attention and are read from the recorded
probabilities. The final logit soft-cap ``c·tanh(z/c)`` is not linear: the logit methods explain ``z``
(:attr:`ModelSpec.logit_softcap`).
"""

from torch import nn
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

from . import llama
from .base import UNIT_OFFSET_RMS_NORMS, LayerSpec, ModelSpec

FAMILY = "Gemma 2 / Gemma 3 (text)"
MODEL_TYPES = {"gemma2", "gemma3_text"}

UNIT_OFFSET_RMS_NORMS.update({Gemma2RMSNorm, Gemma3RMSNorm})


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    mlp = layer.mlp
    return LayerSpec(
        module=layer,
        self_attn=llama.attention_spec(
            layer, config, layer.self_attn.v_proj, norms=(layer.input_layernorm, layer.post_attention_layernorm)
        ),
        ffn=llama.gated_ffn(
            layer,
            mlp.up_proj,
            mlp.gate_proj,
            mlp.act_fn,
            norms=(layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm),
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec, logit_softcap=model.config.final_logit_softcapping)
