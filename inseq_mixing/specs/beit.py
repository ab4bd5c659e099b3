"""BEiT and Data2Vec-vision (vision encoders): pre-LN blocks with a relative position bias and a layer scale.

Blocks: ``layernorm_before``, self-attention (``q_proj`` / ``k_proj`` / ``v_proj``, BEiT's; Data2Vec-vision's older
``attention.attention`` with ``query`` / ``key`` / ``value`` and ``attention.output.dense``), ``lambda_1``, residual;
``layernorm_after``, the FFN (``fc1``, activation, ``fc2``; Data2Vec-vision: ``intermediate``, ``output``),
``lambda_2``, residual. The relative position bias (each layer's, or one shared by all) is added to the attention
scores before the softmax: it is in the recorded attention probabilities, so every method sees it, and nothing else
reads it. The layer scales ``lambda_1`` / ``lambda_2`` are bare parameters of the block: described as norms without
statistics on the branch outputs (:class:`~.base.LayerScale`), as DINOv2's (**our extension** of the methods to
layer-scaled blocks); absent when ``layer_scale_init_value`` is 0. Tokens: [CLS], then the patches.

Read-outs: with ``use_mean_pooling`` (BEiT's default) the classifier reads the mean of the patches' final states
through the pooler's LayerNorm (the encoder has no final norm then); without it, [CLS] after the final ``layernorm``.
Bare encoders (``BeitModel``, ``Data2VecVisionModel``) take the map methods.
"""

from torch import nn

from .base import FFNSpec, LayerScale, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError
from .base import attention as attn_spec
from .encoder_heads import head_spec, pooled_head_spec

FAMILY = "BEiT, Data2Vec-vision (vision)"
KIND = "vision"
MODEL_TYPES = {"beit", "data2vec-vision"}


def layer_scale(layer: nn.Module, name: str, input_module: nn.Module | None) -> LayerScale | None:
    """The block's layer scale ``name`` (a bare parameter) as a norm without statistics on a branch output, or None
    where the block has none."""
    scale = getattr(layer, name, None)
    return LayerScale(scale, input_module) if isinstance(scale, nn.Parameter) else None


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    if hasattr(layer, "mlp"):  # BEiT
        attention, mlp = layer.attention, layer.mlp
        self_attn = attn_spec(attention, attention.v_proj, attention.o_proj, heads, layer.layernorm_before, True,
                              out_norm=layer_scale(layer, "lambda_1", None))  # fmt: skip
        ffn = FFNSpec(forward=mlp, norm=layer.layernorm_after, pre_norm=True, w_in=mlp.fc1, w_out=mlp.fc2,
                      activation=mlp.activation_fn, out_norm=layer_scale(layer, "lambda_2", mlp))  # fmt: skip
        return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)
    attention, output = layer.attention.attention, layer.attention.output
    self_attn = attn_spec(attention, attention.value, output.dense, heads, layer.layernorm_before, True,
                          out_norm=layer_scale(layer, "lambda_1", None), output_module=output)  # fmt: skip

    def ffn_forward(hidden):
        return layer.output(layer.intermediate(hidden))

    ffn = FFNSpec(forward=ffn_forward, norm=layer.layernorm_after, pre_norm=True, w_in=layer.intermediate.dense,
                  w_out=layer.output.dense, activation=layer.intermediate.intermediate_act_fn,
                  out_norm=layer_scale(layer, "lambda_2", layer.output))  # fmt: skip
    return LayerSpec(module=layer, self_attn=self_attn, ffn=ffn)


def build(model: nn.Module) -> ModelSpec:
    config, base = model.config, model.base_model
    name = type(model).__name__
    if not name.endswith(("ForImageClassification", "Model")):
        raise UnsupportedModelError(
            f"{name}: inseq-mixing explains BEiT and Data2Vec-vision image classifiers and bare encoders; load the "
            "checkpoint as ...ForImageClassification or ...Model."
        )
    pooled = name.endswith("ForImageClassification") and config.use_mean_pooling
    if pooled:
        head = pooled_head_spec(("mean",), 1, (base.pooler.layernorm, model.classifier))
    else:
        head = head_spec(model, {"sequence_classification": ("classifier",)})
    final_norm = None if isinstance(base.layernorm, nn.Identity) else base.layernorm
    layers = base.layers if hasattr(base, "layers") else base.encoder.layer  # BEiT's, Data2Vec-vision's
    return ModelSpec(
        family=config.model_type,
        decoder=StackSpec(layers=[layer_spec(layer, config) for layer in layers], final_norm=final_norm),
        causal=False,
        head=head,
        output_attentions=config.model_type == "data2vec-vision",  # its attention returns probabilities only then
    )
