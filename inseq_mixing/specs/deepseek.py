"""DeepSeek-V2 / V3 (and Kimi K2, which is DeepSeek-V3's architecture): multi-head latent attention and a mixture of
experts with shared experts, in the Llama layout (pre-RMSNorm, SwiGLU; dense FFNs in the first layers).

Multi-head latent attention: keys and values are decompressed per head from one per-token latent
``c_j = RMSNorm(x̂_j W_down)`` (``kv_a_proj_with_mqa``'s first ``kv_lora_rank`` outputs, ``kv_a_layernorm``) by
``kv_b_proj``, whose outputs hold each head's key part then its value part; queries pass through their own latent
(``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``) and a rotary part shared by the heads' keys. Queries, keys and the
rotary part shape the recorded attention probabilities; the value path, what the methods decompose, is
``v^h_j = c_j W^h_up``: linear in the block's normalised input once the latent norm is frozen at its recorded
statistics (our extension for every method: the papers treat standard multi-head attention). The mixture's router
(sigmoid scores, group-limited top-k, a bias on the choice) is read through its recorded output, as every router's.
"""

import dataclasses

import torch
from torch import nn

from . import llama, mixture
from .base import AttentionSpec, LatentValues, LayerSpec, ModelSpec, SlicedLinear, UnsupportedModelError, attention

FAMILY = "DeepSeek-V2 / V3 (multi-head latent attention, mixture of experts)"
MODEL_TYPES = {"deepseek_v2", "deepseek_v3"}


def latent_attention_spec(layer: nn.Module, config) -> AttentionSpec:
    """The latent attention of a DeepSeek block (values at each head's last ``v_head_dim`` outputs of
    ``kv_b_proj``)."""
    attn = layer.self_attn
    if attn.kv_a_proj_with_mqa.bias is not None:
        raise UnsupportedModelError(
            f"{type(attn).__name__} has a bias on its latent down-projection, which the decomposition of its values "
            "does not split yet: load the model with attention_bias=False (DeepSeek's own checkpoints have none)."
        )
    heads, key_width, value_width = config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim
    per_head = key_width + value_width
    values = torch.cat([torch.arange(h * per_head + key_width, (h + 1) * per_head) for h in range(heads)])
    spec = attention(attn, attn.kv_b_proj, attn.o_proj, (heads, heads, value_width), layer.input_layernorm, True,
                     values)  # fmt: skip
    down = SlicedLinear(attn.kv_a_proj_with_mqa, slice(0, config.kv_lora_rank))
    return dataclasses.replace(spec, latent=LatentValues(down, attn.kv_a_layernorm))


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    return LayerSpec(module=layer, self_attn=latent_attention_spec(layer, config), ffn=mixture.ffn_spec(layer))


def build(model: nn.Module) -> ModelSpec:
    return llama.build(model, layer_spec)
