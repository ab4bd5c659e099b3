"""Phi-3: the Llama layout with a fused ``qkv_proj`` (values are its last ``H_kv · head_dim`` outputs) and a fused
``gate_up_proj`` (gate first, then the linear branch)."""

from torch import nn

from . import llama
from .base import LayerSpec, ModelSpec, SlicedLinear

FAMILY = "Phi-3"
MODEL_TYPES = {"phi3"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    queries_and_keys = (config.num_attention_heads + config.num_key_value_heads) * layer.self_attn.head_dim
    mlp, width = layer.mlp, config.intermediate_size
    return LayerSpec(
        module=layer,
        self_attn=llama.attention_spec(layer, config, layer.self_attn.qkv_proj, slice(queries_and_keys, None)),
        ffn=llama.gated_ffn(
            layer,
            w_in=SlicedLinear(mlp.gate_up_proj, slice(width, 2 * width)),
            w_gate=SlicedLinear(mlp.gate_up_proj, slice(0, width)),
            activation=mlp.activation_fn,
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec)
