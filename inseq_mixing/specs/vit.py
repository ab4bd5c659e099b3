"""Vision Transformers with the ViT block layout: ViT and DeiT (image classifiers and bare encoders).

The image is cut into patches by a convolution whose stride is its kernel (each patch embedded on its own pixels:
nothing mixes between patches there), then [CLS] (and DeiT's distillation token) is prepended and the position
embeddings added. Decompositions start at the first block's input, after that. Pre-LN blocks: ``layernorm_before``,
``attention`` (``q_proj`` / ``k_proj`` / ``v_proj``, softmax, ``o_proj``), residual; ``layernorm_after``, ``mlp``
(``fc1``, activation, ``fc2``), residual; a final ``layernorm``. ``...ForImageClassification`` reads [CLS] after
the final norm through one linear ``classifier`` (a sequence classifier's head, position 0); the bare encoder
(``ViTModel``, ``DeiTModel``) gives the map methods only. DeiT's classifier with its teacher
(``DeiTForImageClassificationWithTeacher``) averages two heads on two tokens and is refused: load the checkpoint as
``DeiTForImageClassification`` (its [CLS] head) instead.
"""

from torch import nn

from .base import FFNSpec, LayerSpec, ModelSpec, StackSpec, UnsupportedModelError
from .base import attention as attn_spec
from .encoder_heads import head_spec

FAMILY = "ViT, DeiT (vision)"
MODEL_TYPES = {"vit", "deit"}

HEADS = {"sequence_classification": ("classifier",)}


def layer_spec(layer: nn.Module, config) -> LayerSpec:
    attention, mlp = layer.attention, layer.mlp
    heads = (config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
    return LayerSpec(
        module=layer,
        self_attn=attn_spec(attention, attention.v_proj, attention.o_proj, heads, layer.layernorm_before, True),
        ffn=FFNSpec(
            forward=mlp,
            norm=layer.layernorm_after,
            pre_norm=True,
            w_in=mlp.fc1,
            w_out=mlp.fc2,
            activation=mlp.activation_fn,
        ),
    )


def build(model: nn.Module) -> ModelSpec:
    if type(model).__name__.endswith("WithTeacher"):
        raise UnsupportedModelError(
            f"{type(model).__name__} averages a [CLS] head and a distillation head, read at two tokens: load the "
            "checkpoint as DeiTForImageClassification (its [CLS] head) to explain it."
        )
    base = model.base_model
    layers = [layer_spec(layer, model.config) for layer in base.layers]
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(layers=layers, final_norm=base.layernorm),
        causal=False,
        head=head_spec(model, HEADS),
    )
