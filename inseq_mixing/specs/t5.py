"""T5 and mT5 (v1.0 with ReLU FFN, v1.1 with gated-GELU FFN): pre-RMSNorm blocks, relative position bias."""

import transformers
from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec

FAMILY = "T5 / mT5 (v1.0 and gated-GELU v1.1)"
MODEL_TYPES = {"t5", "mt5", "umt5"}
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


def attention_spec(sublayer: nn.Module, attn: nn.Module) -> AttentionSpec:
    return AttentionSpec(
        module=attn,
        value_proj=attn.v,
        value_slice=slice(None),
        out_proj=attn.o,
        num_heads=attn.n_heads,
        num_kv_heads=attn.n_heads,
        head_dim=attn.key_value_proj_dim,
        norm=sublayer.layer_norm,
        pre_norm=True,
        probs_index=-1,
    )


def ffn_spec(ff_sub: nn.Module) -> FFNSpec:
    dense = ff_sub.DenseReluDense
    gated = hasattr(dense, "wi_0")  # v1.1: gelu(wi_0 x) * wi_1 x
    return FFNSpec(
        forward=dense,
        norm=ff_sub.layer_norm,
        pre_norm=True,
        w_in=dense.wi_1 if gated else dense.wi,
        w_out=dense.wo,
        activation=dense.act,
        w_gate=dense.wi_0 if gated else None,
    )


def layer_spec(block: nn.Module) -> LayerSpec:
    self_sub, ff_sub = block.layer[0], block.layer[-1]
    cross = None
    if len(block.layer) == 3:
        cross = attention_spec(block.layer[1], block.layer[1].EncDecAttention)
    return LayerSpec(
        module=block,
        self_attn=attention_spec(self_sub, self_sub.SelfAttention),
        cross_attn=cross,
        ffn=ffn_spec(ff_sub),
    )


def stack_spec(stack: nn.Module) -> StackSpec:
    return StackSpec(layers=[layer_spec(block) for block in stack.block], final_norm=stack.final_layer_norm)


def rescales_decoder_output(config) -> bool:
    """Whether the model multiplies the final decoder state by ``d_model ** -0.5`` before the LM head.

    T5 on transformers 5 names the flag. Before that, T5, mT5 and umT5 rescale whenever the embeddings are tied;
    mT5 on transformers 5 never rescales (its config always says tied).
    """
    flag = getattr(config, "scale_decoder_outputs", None)
    if flag is not None:
        return bool(flag)
    if config.model_type == "mt5" and TRANSFORMERS_MAJOR >= 5:
        return False
    return bool(getattr(config, "tie_word_embeddings", True))


def build(model: nn.Module) -> ModelSpec:
    config = model.config
    return ModelSpec(
        family=config.model_type,
        encoder=stack_spec(model.encoder),
        decoder=stack_spec(model.decoder),
        lm_head=model.get_output_embeddings(),
        logits_scale=config.d_model**-0.5 if rescales_decoder_output(config) else 1.0,
    )
