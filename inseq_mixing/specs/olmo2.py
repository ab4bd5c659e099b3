"""OLMo-2 and FlexOLMo (OLMo-2 with a mixture of experts as FFN): the Llama layout with the norms moved to the branch
outputs, ``x + norm(f(x))``, and q/k norms.

Attention and FFN read the residual stream itself (no input norm); ``post_attention_layernorm`` and
``post_feedforward_layernorm`` normalise their outputs before the residual sum. The q/k norms act on queries and keys
only and are read from the recorded probabilities.
"""

from torch import nn

from . import llama, mixture
from .base import LayerSpec, ModelSpec

FAMILY = "OLMo-2, FlexOLMo"
MODEL_TYPES = {"olmo2", "flex_olmo"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    return LayerSpec(
        module=layer,
        self_attn=llama.attention_spec(
            layer, config, layer.self_attn.v_proj, norms=(None, layer.post_attention_layernorm)
        ),
        ffn=mixture.ffn_spec(layer, norms=(None, layer.post_feedforward_layernorm)),
    )


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec)
