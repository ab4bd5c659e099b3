"""BART-style encoder–decoders: Marian, BART, mBART, M2M100 (NLLB).

All four share the layer layout ``self_attn``/``self_attn_layer_norm``, ``encoder_attn``/``encoder_attn_layer_norm``,
``fc1``/``activation_fn``/``fc2``/``final_layer_norm``. Marian and BART are post-LN; mBART and M2M100 are pre-LN with a
final layer norm on each stack.
"""

from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec

POST_LN_TYPES = {"marian", "bart"}
FAMILY = "Marian, BART, mBART, M2M100 / NLLB"
MODEL_TYPES = {"marian", "bart", "mbart", "m2m_100"}


def attention_spec(attn: nn.Module, norm: nn.Module, pre_norm: bool) -> AttentionSpec:
    return AttentionSpec(
        module=attn,
        value_proj=attn.v_proj,
        value_slice=slice(None),
        out_proj=attn.out_proj,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_heads,
        head_dim=attn.head_dim,
        norm=norm,
        pre_norm=pre_norm,
    )


def ffn_forward(layer: nn.Module):
    def forward(hidden):
        return layer.fc2(layer.activation_fn(layer.fc1(hidden)))

    return forward


def layer_spec(layer: nn.Module, pre_norm: bool) -> LayerSpec:
    cross = None
    if hasattr(layer, "encoder_attn"):
        cross = attention_spec(layer.encoder_attn, layer.encoder_attn_layer_norm, pre_norm)
    return LayerSpec(
        module=layer,
        self_attn=attention_spec(layer.self_attn, layer.self_attn_layer_norm, pre_norm),
        cross_attn=cross,
        ffn=FFNSpec(
            forward=ffn_forward(layer),
            norm=layer.final_layer_norm,
            pre_norm=pre_norm,
            w_in=layer.fc1,
            w_out=layer.fc2,
            activation=layer.activation_fn,
        ),
    )


def stack_spec(stack: nn.Module, pre_norm: bool) -> StackSpec:
    return StackSpec(
        layers=[layer_spec(layer, pre_norm) for layer in stack.layers],
        final_norm=getattr(stack, "layer_norm", None) if pre_norm else None,
    )


def build(model: nn.Module) -> ModelSpec:
    model_type = model.config.model_type
    pre_norm = model_type not in POST_LN_TYPES
    base = model.base_model
    return ModelSpec(
        family=model_type,
        encoder=stack_spec(base.encoder, pre_norm),
        decoder=stack_spec(base.decoder, pre_norm),
        lm_head=model.get_output_embeddings(),
        logits_bias=getattr(model, "final_logits_bias", None),
        max_positions=None if model_type == "m2m_100" else model.config.max_position_embeddings,  # M2M100: sinusoids
    )
