"""GPT-NeoX / Pythia: pre-LN blocks with a parallel residual (``x + attn(ln₁ x) + mlp(ln₂ x)``, the default; the
sequential variant is supported too), a fused QKV projection laid out per head (``[q_h | k_h | v_h]`` for each head
``h``), partial rotary embeddings (inside attention: they shape the recorded probabilities only)."""

import torch
from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, attention

FAMILY = "GPT-NeoX / Pythia"
MODEL_TYPES = {"gpt_neox"}


def value_indices(heads: int, head_dim: int) -> torch.Tensor:
    """Outputs of the fused projection that hold the values: the last third of each head's ``3 · head_dim`` block."""
    starts = torch.arange(heads) * 3 * head_dim + 2 * head_dim
    return (starts[:, None] + torch.arange(head_dim)).reshape(-1)


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    attn, heads = layer.attention, config.num_attention_heads
    values = value_indices(heads, attn.head_size)
    self_attn = attention(
        attn, attn.query_key_value, attn.dense, (heads, heads, attn.head_size), layer.input_layernorm, True, values
    )
    mlp = layer.mlp
    ffn = FFNSpec(
        forward=mlp,
        norm=layer.post_attention_layernorm,
        pre_norm=True,
        w_in=mlp.dense_h_to_4h,
        w_out=mlp.dense_4h_to_h,
        activation=mlp.act,
        parallel=config.use_parallel_residual,
    )
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    base = model.base_model
    return ModelSpec(
        family="gpt_neox",
        decoder=StackSpec(
            layers=[layer_spec(layer, model.config) for layer in base.layers], final_norm=base.final_layer_norm
        ),
        lm_head=model.get_output_embeddings(),
    )
