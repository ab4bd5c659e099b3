"""GPT-2: pre-LN blocks, fused QKV ``Conv1D`` projection, learned absolute positions."""

from torch import nn

from .base import AttentionSpec, FFNSpec, LayerSpec, ModelSpec, StackSpec

FAMILY = "GPT-2"
MODEL_TYPES = {"gpt2"}


def layer_spec(block: nn.Module) -> LayerSpec:
    attn = block.attn
    d_model = attn.embed_dim
    self_attn = AttentionSpec(
        module=attn,
        value_proj=attn.c_attn,
        value_slice=slice(2 * d_model, 3 * d_model),
        out_proj=attn.c_proj,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_heads,
        head_dim=attn.head_dim,
        norm=block.ln_1,
        pre_norm=True,
    )
    mlp = block.mlp
    ffn = FFNSpec(forward=mlp, norm=block.ln_2, pre_norm=True, w_in=mlp.c_fc, w_out=mlp.c_proj, activation=mlp.act)
    return LayerSpec(module=block, self_attn=self_attn, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    if getattr(model.config, "add_cross_attention", False):
        raise NotImplementedError("GPT-2 with cross-attention layers is not supported.")
    base = model.base_model
    return ModelSpec(
        family="gpt2",
        decoder=StackSpec(layers=[layer_spec(block) for block in base.h], final_norm=base.ln_f),
        lm_head=model.get_output_embeddings(),
        max_positions=model.config.n_positions,
    )
