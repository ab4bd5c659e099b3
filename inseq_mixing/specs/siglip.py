"""SigLIP's image tower (``siglip_vision_model``, and the one inside ``SiglipForImageClassification``).

No [CLS]: the tokens are the patches alone, after the patch embedding and the position embeddings. The blocks are
CLIP's (:func:`.clip.layer_spec`); the final ``post_layernorm`` normalises every token.

Read-outs: ``SiglipForImageClassification``: the mean of all tokens' final states through one linear ``classifier``
(a pooled read-out, :class:`~.base.HeadSpec`); ``SiglipVisionModel``: the bare encoder (map methods). Refused:
``SiglipModel``'s image–text similarity. Its image embedding comes from the attention-pooling head, a further
multi-head attention whose query is a learned probe (not a token), followed by an MLP with its own residual: a block
outside the token sequence, which none of the methods' definitions covers (there is no probe token for maps to
have a row for). Its attention is not the model's own patch mixing either. Load ``SiglipVisionModel`` for the maps.
"""

from torch import nn

from .base import ModelSpec, StackSpec, UnsupportedModelError
from .clip import layer_spec, tower
from .encoder_heads import pooled_head_spec

FAMILY = "SigLIP image tower (vision)"
MODEL_TYPES = {"siglip", "siglip_vision_model"}


def build(model: nn.Module) -> ModelSpec:
    name, vision = type(model).__name__, tower(model)
    if name == "SiglipForImageClassification":
        head = pooled_head_spec(("mean",), 0, (model.classifier,))
    elif name == "SiglipVisionModel":
        head = None
    else:
        raise UnsupportedModelError(
            f"{name}: SigLIP's image–text similarity is read through an attention-pooling head (a learned probe "
            "attending over the patches, then an MLP), a block outside the token sequence that the methods do not "
            "define; load SiglipVisionModel (map methods) or SiglipForImageClassification instead."
        )
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(
            layers=[layer_spec(layer, vision.config) for layer in vision.encoder.layers],
            final_norm=vision.post_layernorm,
        ),  # fmt: skip
        causal=False,
        head=head,
    )
