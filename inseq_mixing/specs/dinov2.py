"""DINOv2 and DINOv2 with registers (vision encoders): pre-LN blocks with a layer scale on each branch.

Blocks: ``norm1``, ``attention`` (``q_proj`` / ``k_proj`` / ``v_proj``, softmax, ``o_proj``), ``layer_scale1``,
residual; ``norm2``, ``mlp`` (``fc1``, activation, ``fc2``), ``layer_scale2``, residual; a final ``layernorm``. A layer
scale multiplies a branch's output by a learned per-channel vector: it is linear, so it is described as a norm
without statistics on the branch output (``out_norm``), where Gemma 2's sandwich norms sit, and every method applies it
to each part (**our extension** of the methods to layer-scaled blocks). The tokens are [CLS], the registers
(``dinov2_with_registers``: ``num_register_tokens`` of them), then the patches, after the patch embedding and the
position embeddings (interpolated by the model to the image's size). Bare encoders (``Dinov2Model``) take the map
methods. The SwiGLU FFN (``use_swiglu_ffn``: ``down_proj(silu(gate_proj(x)) ⊙ up_proj(x))``) is a gated FFN as
Llama's. The image classifier (``Dinov2ForImageClassification``) reads [CLS] and the mean of the patches (registers
left out) after the final norm, concatenated, through one linear ``classifier``: a pooled read-out
(:class:`~.base.HeadSpec`), linear, so the logit methods stay complete.
"""

from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec
from .base import attention as attn_spec
from .encoder_heads import model_task, pooled_head_spec

FAMILY = "DINOv2, DINOv2 with registers (vision)"
KIND = "vision"
MODEL_TYPES = {"dinov2", "dinov2_with_registers"}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    attention, mlp = layer.attention, layer.mlp
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    self_attn = attn_spec(attention, attention.v_proj, attention.o_proj, heads, layer.norm1, True,
                          out_norm=layer.layer_scale1)  # fmt: skip
    if getattr(config, "use_swiglu_ffn", False):
        ffn = FFNSpec(forward=mlp, norm=layer.norm2, pre_norm=True, w_in=mlp.up_proj, w_out=mlp.down_proj,
                      activation=mlp.act_fn, w_gate=mlp.gate_proj, out_norm=layer.layer_scale2)  # fmt: skip
    else:
        ffn = FFNSpec(forward=mlp, norm=layer.norm2, pre_norm=True, w_in=mlp.fc1, w_out=mlp.fc2,
                      activation=mlp.activation_fn, out_norm=layer.layer_scale2)  # fmt: skip
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    config = model.config
    head = None
    if model_task(model) is not None:  # [CLS] beside the mean of the patches (after [CLS] and the registers)
        patches_from = 1 + getattr(config, "num_register_tokens", 0)
        head = pooled_head_spec((0, "mean"), patches_from, (model.classifier,))
    base = model.base_model
    return ModelSpec(
        family=config.model_type,
        decoder=StackSpec(
            layers=[layer_spec(layer, config) for layer in base.encoder.layer], final_norm=base.layernorm
        ),
        causal=False,
        head=head,
    )
