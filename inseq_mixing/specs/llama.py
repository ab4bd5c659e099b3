"""Llama-style decoders (Llama, Mistral, Qwen2): pre-RMSNorm, RoPE, grouped-query attention, SwiGLU FFN."""

from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec, linear_in_out

MODEL_TYPES = {"llama", "mistral", "qwen2"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    attn = layer.self_attn
    out_weight, out_bias = linear_in_out(attn.o_proj)
    self_attn = AttentionSpec(
        module=attn,
        value_proj=attn.v_proj,
        value_slice=slice(None),
        out_proj=attn.o_proj,
        out_weight=out_weight,
        out_bias=out_bias,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim,
        norm=layer.input_layernorm,
        pre_norm=True,
    )
    mlp = layer.mlp
    ffn = FFNSpec(
        forward=mlp,
        norm=layer.post_attention_layernorm,
        pre_norm=True,
        w_in=mlp.up_proj,
        w_out=mlp.down_proj,
        activation=mlp.act_fn,
        w_gate=mlp.gate_proj,
    )
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    base = model.base_model
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=[layer_spec(layer, model.config) for layer in base.layers], final_norm=base.norm),
        lm_head=model.get_output_embeddings(),
    )
