"""The vision front end: Vision Transformer classifiers, bare image encoders and CLIP's image–text similarity,
explained over image patches.

:func:`inseq_mixing.load_model` gives ViT, DeiT, DINOv2, BEiT, Data2Vec-vision, CLIP's, SigLIP's and SigLIP 2's image
models (``...ForImageClassification``, the bare encoders, ``CLIPModel``) a :class:`VisionAttributionModel` with the
surface of the text encoder front end (both are modalities of :class:`~.encoder_base.EncoderFrontEnd`):
``.attribute(images, targets=None, foils=None, *, positions=None, batch_size=8, **options)`` returns
``inseq.FeatureAttributionOutput``.

- Inputs: a path (PNG, JPEG, anything Pillow reads), a PIL image, an array ``(H, W)``, ``(H, W, 3)`` or ``(H, W, 4)``
  (values in 0–255; ``uint16`` and 16-bit PNGs in 0–65535; floats in 0–1), a tensor ``(3, H, W)``, or a list of them;
  values outside these ranges (a normalised tensor) and images without pixels are refused (:func:`read_image`).
  Greyscale and RGBA images are converted to RGB; the image processor resizes and normalises them to the checkpoint's
  size.
- Units: the model's tokens, which are the image's units: ``[CLS]``, DeiT's ``[DIST]``, DINOv2's registers
  ``[REG1]``, ..., then one per patch labelled ``r{row}c{column}`` in reading order on the image's own grid (nothing
  dropped; SigLIP has no [CLS]). The decompositions start at the first block's input, after the patch embedding and
  the position embeddings (the patch convolution mixes the pixels of one patch only). SigLIP 2's processor gives
  each image's patches flattened at its own aspect ratio, padded: the padding is masked as in a padded text batch.
- What is explained: a classifier's logit for the predicted label (``targets=`` a label index or name, ``foils=``
  another label), read at [CLS] through the final norm and the classifier as for a text classifier, or through a
  pooled read-out (the mean of the patches, [CLS] beside it, DeiT's two heads: each read position's share summed,
  :mod:`inseq_mixing.methods.head`); ``CLIPModel``: the image–text similarity of each image with its text
  (``targets=`` a text per image, ``foils=`` another text); map methods: the rows of ``positions=`` (default [CLS];
  SigLIP: every patch).

The gradient baselines (``integrated_gradients``, ``deeplift``, ``saliency``, ``input_x_gradient``, Captum's) attribute
the explained logit to the token embeddings the first block reads (patch embeddings with their position embeddings,
and [CLS]), summed over the embedding per token, so that they share the methods' units; the default baseline is the
zero embedding (``baselines=`` a number or a tensor broadcastable to ``(tokens, d_model)``). They are not on pixels.

No math here: the methods are the declarations' ``compute``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..declarations import InputSize
from ..specs.clip import TextRows, tower
from ..trace import ModelCall, head_logits, trace_call
from .common import first_block_input, first_block_input_replaced, plain, saved_model
from .encoder_base import EncoderBatch, EncoderFrontEnd, per_text, per_text_positions
from .layout import token_list

#: Extra tokens before the patches, by ``config.model_type``: their labels, in order (registers: see
#: :func:`leading_tokens`; SigLIP has none).
LEADING_TOKENS = {
    "vit": ("[CLS]",), "deit": ("[CLS]", "[DIST]"), "dinov2": ("[CLS]",), "beit": ("[CLS]",),
    "data2vec-vision": ("[CLS]",), "clip": ("[CLS]",), "clip_vision_model": ("[CLS]",), "siglip": (),
    "siglip_vision_model": (), "siglip2": (), "siglip2_vision_model": (),
}  # fmt: skip
#: Families whose position embeddings the model interpolates to the image's grid (any size, in whole patches).
INTERPOLATED_POSITIONS = ("dinov2", "dinov2_with_registers")
#: Families whose processor gives the patches flattened and padded, with each image's grid (SigLIP 2's NaFlex).
PATCHIFIED = ("siglip2", "siglip2_vision_model")
#: What a vision model reads, of a batch's inputs.
MODEL_INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
#: What a pooled read-out reads, in words (:class:`~inseq_mixing.specs.HeadSpec`).
POOLED_WORDS = {0: "[CLS]", 1: "[DIST]", "mean": "the mean of the patches"}


def leading_tokens(config) -> tuple[str, ...]:
    """The labels of the tokens before the patches: [CLS], DeiT's [DIST], DINOv2's registers [REG1], [REG2], ..."""
    if config.model_type == "dinov2_with_registers":
        return ("[CLS]", *(f"[REG{index + 1}]" for index in range(config.num_register_tokens)))
    return LEADING_TOKENS[config.model_type]


def vision_config(config):
    """The image tower's config (CLIP's and SigLIP's are inside the model's)."""
    return getattr(config, "vision_config", None) or config


class ImageError(ValueError):
    """An image that cannot be read or explained (the message names it and says what to do)."""


@dataclass
class _Image:
    """One image to explain, read into RGB, and how errors name it."""

    image: object  # a PIL image
    target: object
    foil: object
    positions: list[int] | None
    name: str


def checked_box(box, image, what: str, where: str = "the image") -> list[float]:
    """``box`` as ``[x0, y0, x1, y1]`` floats inside ``image`` (its own pixels), or ``ValueError`` that starts with
    ``what`` (the row, or the box, that gave it) and names the image as ``where``."""
    if not isinstance(box, list | tuple) or len(box) != 4:
        raise ValueError(f"{what}: a box is [x0, y0, x1, y1] in the image's pixels, not {box!r}.")
    x0, y0, x1, y1 = (float(value) for value in box)
    if not (0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height):
        raise ValueError(f"{what} {[x0, y0, x1, y1]} is not inside {where}, {image.width} × {image.height} pixels.")
    return [x0, y0, x1, y1]


def read_image(image, name: str):
    """``image`` as an RGB PIL image: a path, a PIL image, an array or a tensor (see the module docstring).

    Pixel values are read by their type: 8-bit images and ``uint8`` arrays as they are, 16-bit images (``I;16`` PNGs,
    ``uint16`` arrays) scaled from 0–65535 to 0–255, other integer arrays in 0–255, float arrays and tensors in 0–1
    (or 0–255 when a value exceeds 1), booleans as black and white. Anything else (negative values, as a normalised
    tensor has; floats above 255; integers above 255 in a type other than ``uint16``) is refused, not clipped.

    Raises:
        ImageError: A missing file, a file that is not an image, an array of another shape, an image without pixels,
            NaN or infinite values, values outside the ranges above.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, str | Path):
        path = Path(image)
        if not path.is_file():
            raise ImageError(f"{name}: no image file at {str(path)!r}.")
        try:
            with Image.open(path) as opened:
                opened.load()
                image = opened.copy()
        except (UnidentifiedImageError, OSError) as error:
            raise ImageError(f"{name}: {str(path)!r} is not an image Pillow can read ({error}).") from None
    if isinstance(image, Image.Image):
        if not image.width or not image.height:
            raise ImageError(f"{name} is {image.width} × {image.height} pixels: give an image with pixels.")
        if image.mode not in WIDE_MODES:  # 8 bits per channel: Pillow converts exactly
            return image.convert("RGB")
        image = np.asarray(image)  # 16-bit, 32-bit integer or float pixels: read by their type below
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu()
        if image.dim() == 3 and image.shape[0] in (1, 3, 4):  # (C, H, W) → (H, W, C)
            image = image.permute(1, 2, 0)
        image = image.numpy() if image.dtype in NUMPY_TENSOR_TYPES else image.float().numpy()
    if not isinstance(image, np.ndarray):
        raise ImageError(
            f"{name} is a {type(image).__name__}: give a path, a PIL image, an array (H, W[, 3 or 4]) or a tensor "
            "(3, H, W)."
        )
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] not in (3, 4)):
        raise ImageError(f"{name} has shape {tuple(image.shape)}: an image array is (H, W), (H, W, 3) or (H, W, 4).")
    if not image.shape[0] or not image.shape[1]:
        raise ImageError(f"{name} is {image.shape[1]} × {image.shape[0]} pixels: give an image with pixels.")
    return Image.fromarray(_eight_bits(image, name)).convert("RGB")


#: PIL modes whose pixels are not 8 bits per channel (read through NumPy by their type, not converted by Pillow).
WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
#: Tensor types NumPy takes as they are (the others, half precision included, are read as float32).
NUMPY_TENSOR_TYPES = (torch.uint8, torch.uint16, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64,
                      torch.bool)  # fmt: skip
_RANGES = "8-bit values in 0–255, uint16 values in 0–65535, or floats in 0–1 (or 0–255)"


def _eight_bits(image: np.ndarray, name: str) -> np.ndarray:
    """An image array's values as ``uint8`` (see :func:`read_image`), or an error naming the image and its range."""
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.uint16:  # 16-bit data: 65535 is white
        return np.round(image.astype(np.float64) * (255.0 / 65535.0)).astype(np.uint8)
    if image.dtype.kind == "b":  # a binary image: True is white
        return image.astype(np.uint8) * 255
    if image.dtype.kind not in "iuf":
        raise ImageError(f"{name} is an array of {image.dtype}: give {_RANGES}.")
    values = image.astype(np.float64)
    if not np.isfinite(values).all():
        raise ImageError(f"{name} has NaN or infinite values: give finite pixel values.")
    low, high = float(values.min()), float(values.max())
    if image.dtype.kind == "f":
        if low < 0 or high > 255:
            normalised = ("; a normalised image (e.g. in [-1, 1]) is refused, not clipped: pass it before its "
                          "normalisation (the processor normalises)") if low < 0 else ""  # fmt: skip
            raise ImageError(f"{name} has values from {low:.4g} to {high:.4g}: give {_RANGES}{normalised}.")
        return np.round(values * 255.0 if high <= 1.0 else values).astype(np.uint8)
    if low < 0 or high > 255:
        raise ImageError(
            f"{name} is an array of {image.dtype} with values from {low:.0f} to {high:.0f}: give {_RANGES} (16-bit "
            "data as uint16)."
        )
    return values.astype(np.uint8)


def _check_image_processor(processor, model: nn.Module) -> None:
    """Refuse a processor that cannot read images (a tokenizer, a speech feature extractor), saying what is needed."""
    from transformers.image_processing_utils import BaseImageProcessor

    if isinstance(processor, BaseImageProcessor) or isinstance(getattr(processor, "image_processor", None),
                                                                 BaseImageProcessor):  # fmt: skip
        return
    raise ValueError(
        f"processor= is a {type(processor).__name__}, which does not read images: {type(model).__name__} needs its "
        "image processor (transformers.AutoImageProcessor.from_pretrained(name)), or for CLIP and SigLIP their "
        "processor with its tokenizer (AutoProcessor.from_pretrained(name))."
    )


def load_saved(name: str, config, tokenizer, processor):
    """A vision model saved under ``name``, as the class it was saved as, with its image processor when not given (the
    vision kind's loader)."""
    import transformers

    processor = processor or transformers.AutoImageProcessor.from_pretrained(name)
    return saved_model(name, config), tokenizer, processor


def explorer_media(front, inputs) -> dict:
    """What the explorer draws beside a vision model's scores: its images."""
    return {"images": inputs}


def _one(value):
    """A list of one text as the text."""
    return value[0] if isinstance(value, list | tuple) and len(value) == 1 else value


class VisionAttributionModel(EncoderFrontEnd):
    """A Vision Transformer with one attribution method (see the module docstring): the image modality of
    :class:`~.encoder_base.EncoderFrontEnd`.

    Args:
        model: A ViT or DeiT image classifier, or a bare ViT, DeiT or DINOv2 encoder.
        processor: Its image processor (resizes and normalises the images).
        method: The method's name.
    """

    item_name = "image"
    NO_HEAD = "load the model with its read-out (...ForImageClassification, or CLIPModel for an image–text similarity)"

    def __init__(self, model: nn.Module, processor, method: str):
        if processor is None:
            raise ValueError("Pass the image processor of this vision model: load_model(model, method, processor=).")
        _check_image_processor(processor, model)
        super().__init__(model, method)
        self.processor = processor
        self.config = vision_config(model.config)
        self.leading = leading_tokens(self.config)
        self.patchified = self.config.model_type in PATCHIFIED
        head = self.spec.head
        self.similarity = head is not None and isinstance(head.out_proj, TextRows)
        self.runner = tower(model) if self.similarity else model  # what reads the pixels
        self.texts: list[str] = []  # an image–text model's texts of the current call: the read-out's rows
        if self.similarity and getattr(processor, "tokenizer", None) is None:
            raise ValueError(
                f"{type(model).__name__} explains an image–text similarity: pass its processor with a tokenizer "
                "(CLIPProcessor), not the image processor alone."
            )

    def for_method(self, method: str) -> VisionAttributionModel:
        """The same model and image processor with another method."""
        return type(self)(self.model, self.processor, method)

    def model_task(self) -> str | None:
        """A read-out of one vector per image (a classifier, an image–text similarity): ``sequence_classification``;
        a bare encoder: None."""
        return None if self.spec.head is None else "sequence_classification"

    def attribute(
        self,
        images,
        targets=None,
        foils=None,
        *,
        positions: list[int] | list[list[int]] | None = None,
        batch_size: int = 8,
        show_progress: bool = True,
        **method_options,
    ):
        """Explain ``images`` (one, or a list; see the module docstring).

        Args:
            images: A path, a PIL image, an array or a tensor, or a list of them.
            targets: Per image, a label index or name (classifiers; default: the predicted label).
            foils: Per image, another label: logit methods explain ``logit(target) − logit(foil)``.
            positions: Bare encoders: the token indices whose rows are explained (default: [CLS]).
            batch_size: Images per forward pass.
            show_progress: Show a progress bar over batches.
            method_options: The method's options (``inseq-mixing methods --options``), and Inseq's names as the
                encoder front end takes them.

        Returns:
            ``inseq.FeatureAttributionOutput``, one sequence per image.
        """
        images = list(images) if isinstance(images, list | tuple) else [images]
        out = self.attribute_inputs(images, targets, foils, batch_size=batch_size, show_progress=show_progress,
                                    method_options=method_options, call={"positions": positions})  # fmt: skip
        out.images = images  # what out.show() draws over (not saved)
        return out

    def before_work(self, items: list[_Image]) -> None:
        """An image–text model's read-out rows: the embeddings of the call's texts."""
        if self.similarity and self.texts:
            self._set_texts()

    def info_entries(self, items: list[_Image], settings=None) -> dict:
        return {
            "image_processor": type(self.processor).__name__,
            "input_images": [item.name for item in items],
            "task": self._task_name(),
            "explained": self._explained_words(),
            **super().info_entries(items, settings),
        }

    def _task_name(self) -> str:
        if self.similarity:
            return "image_text_similarity"
        return "image_encoder" if self.task is None else "image_classification"

    def _explained_words(self) -> str:
        """What is explained, in words (``info["explained"]``)."""
        leading = "([CLS] by default)" if self.leading else "(every token by default: no [CLS])"
        if not self.explains_logit or self.task is None:
            return f"the rows of the explained tokens {leading} in the token-to-token maps; no logit"
        head = self.spec.head
        read = " beside ".join(POOLED_WORDS[name] for name in head.pooling) or "[CLS]"
        if self.similarity:
            return (f"the image–text similarity (logits_per_image: the scaled cosine of the projected {read} and the "
                    "text's embedding) for the text")  # fmt: skip
        return f"the classifier's logit for the label, read from {read}"

    def _set_texts(self) -> None:
        """An image–text model's read-out rows: the embeddings of the call's texts (the text tower, not explained)."""
        tokenizer = self.processor.tokenizer
        encoded = tokenizer(self.texts, padding=True, return_tensors="pt").to(self.device)
        with torch.no_grad():
            embeddings = self.model.get_text_features(**encoded)
        embeddings = getattr(embeddings, "pooler_output", embeddings)
        self.spec.head.out_proj.set_texts(embeddings.float())

    def items(self, images: list, targets, foils, positions=None, names: list[str] | None = None) -> list[_Image]:
        """Each image read (a bad one named before any work, as ``names`` says), with its target, foil and
        positions."""
        targets = per_text(plain(targets), len(images), "targets")
        foils = per_text(plain(foils), len(images), "foils")
        if self.similarity:  # one image's text may come in a list of one (``["a photo of a cat"]``)
            targets, foils = ([_one(value) for value in values] for values in (targets, foils))
            self.texts = self._check_texts(targets, foils)
        positions = per_text_positions(plain(positions), len(images))
        names = names or [f"Image {index}" + (f" ({image})" if isinstance(image, str | Path) else "")
                          for index, image in enumerate(images)]  # fmt: skip
        rows = zip(images, targets, foils, positions, names, strict=True)
        items = [_Image(read_image(image, name), target, foil, chosen, name)
                 for image, target, foil, chosen, name in rows]  # fmt: skip
        self._check(items)
        return items

    def _check_texts(self, targets: list, foils: list) -> list[str]:
        """An image–text model's texts (one per image, and its foil's): each a non-empty string."""
        required = self.explains_logit  # map methods read no text
        for what, values in (("targets", targets), ("foils", foils)):
            for index, value in enumerate(values):
                if (value is None and what == "targets" and required) or not isinstance(value, str | None):
                    raise ValueError(
                        f"Image {index}: {type(self.model).__name__} explains an image–text similarity: give "
                        f"{what}= a text per image (e.g. 'a photo of a cat'), not {value!r}."
                    )
        texts = sorted({value for value in (*targets, *foils) if value is not None})
        limit = getattr(getattr(self.model.config, "text_config", None), "max_position_embeddings", None)
        for text in texts:
            count = len(self.processor.tokenizer(text)["input_ids"])
            if limit is not None and count > limit:
                index = next(index for index, value in enumerate((*targets, *foils)) if value == text) % len(targets)
                raise ValueError(
                    f"Image {index}: the text {text[:60]!r} has {count} tokens, but {type(self.model).__name__}'s "
                    f"text tower reads at most {limit} (its position embeddings): give a shorter text."
                )
        return texts

    def output_index(self, value) -> int:
        """A label's index, or an image–text model's text's row."""
        if self.similarity:
            return self.texts.index(value)
        return super().output_index(value)

    def validate(self, images, targets=None, foils=None, positions=None, names=None) -> None:
        """Raise the error :meth:`attribute` would raise for these inputs, without running the model."""
        images = list(images) if isinstance(images, list | tuple) else [images]
        self.items(images, targets, foils, positions, names)

    def _check(self, items: list[_Image]) -> None:
        """Targets, foils and positions checked against each image's tokens, before any work (one image processed
        where the processor gives every image the same size; SigLIP 2's, each at its own)."""
        checked = items if self.patchified else items[:1]
        _, mask, _ = self.encode([item.image for item in checked])
        mask = mask.expand(len(items), -1)
        ids = torch.arange(mask.shape[1]).expand(len(items), -1)
        explained = self.explained_cells({"input_ids": ids, "attention_mask": mask.cpu()},
                                    [item.positions for item in items], [item.name for item in items])  # fmt: skip
        self.output_ids(ids, explained, [item.target for item in items], [item.foil for item in items],
                         torch.zeros_like(ids), [item.name for item in items])  # fmt: skip

    def input_sizes(self, items: list[_Image], settings=None) -> list[InputSize]:
        """Each image's tokens: the leading ones and its patches (one image processed where the processor gives every
        image the same size; SigLIP 2's, each at its own)."""
        checked = items if self.patchified else items[:1]
        _, mask, _ = self.encode([item.image for item in checked])
        counts = mask.sum(-1).tolist()
        return [InputSize(int(counts[index if self.patchified else 0])) for index in range(len(items))]

    def encode(self, images: list) -> tuple[dict, torch.Tensor, list[tuple[int, int]]]:
        """What the model reads of ``images`` (the processor's output on the model's device, pixels in its
        precision), which of the ``(B, T)`` tokens are real (SigLIP 2 pads its flattened patches), and each image's
        patch grid ``(rows, columns)``."""
        out = self.processor(images=images, return_tensors="pt")
        dtype = next(self.model.parameters()).dtype
        pixels = out["pixel_values"].to(device=self.device, dtype=dtype)
        if self.patchified:  # (B, patches, p·p·C), padded, with each image's grid
            mask = out["pixel_attention_mask"].to(self.device).long()
            shapes = out["spatial_shapes"].to(self.device)
            inputs = {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": shapes}
            return inputs, mask, [tuple(shape) for shape in out["spatial_shapes"].tolist()]
        rows, columns = self.grid(pixels)
        mask = torch.ones(len(images), len(self.leading) + rows * columns, dtype=torch.long, device=self.device)
        return {"pixel_values": pixels}, mask, [(rows, columns)] * len(images)

    def grid(self, pixels: torch.Tensor) -> tuple[int, int]:
        """Patch rows and columns of processed images ``(B, 3, H, W)`` (a model with fixed position embeddings reads
        its own size only)."""
        patch = self.config.patch_size
        height, width = pixels.shape[-2:]
        size = self.config.image_size
        if self.config.model_type in INTERPOLATED_POSITIONS:
            if height % patch or width % patch:
                raise ImageError(
                    f"The image processor gives {height}×{width} pixels, not whole patches of {patch}: use the "
                    "checkpoint's own image processor, or one cropping to a multiple of the patch size."
                )
        elif (height, width) != (size, size):
            raise ImageError(
                f"The image processor gives {height}×{width} pixels, but this model reads {size}×{size} (its position "
                "embeddings): use the checkpoint's own image processor, or one resizing to that size."
            )
        return height // patch, width // patch

    def replaced(self, inputs: dict, other: dict, kept: torch.Tensor, grid: tuple[int, int]) -> dict:
        """One image's inputs ``n`` times, each with the patches not ``kept`` ``(n, patches)`` (reading order) taken
        from ``other`` (the same image's inputs after a replacement: its mean colour, its blur)."""
        pixels, replacement = inputs["pixel_values"], other["pixel_values"]
        kept = kept.to(pixels.device)
        if self.patchified:  # a patch is a row of the flattened pixels; padding rows stay as they are
            rows = torch.ones(len(kept), pixels.shape[1], dtype=torch.bool, device=pixels.device)
            rows[:, : kept.shape[1]] = kept
            mixed = torch.where(rows[..., None], pixels, replacement)
            return {**{name: value.expand(len(kept), *value.shape[1:]) for name, value in inputs.items()},
                    "pixel_values": mixed}  # fmt: skip
        patch = self.config.patch_size
        mask = kept.reshape(-1, 1, *grid).repeat_interleave(patch, -2).repeat_interleave(patch, -1)
        return {"pixel_values": torch.where(mask, pixels, replacement)}

    def mean_colour(self, inputs: dict) -> dict:
        """The inputs of an image of one colour, the image's mean per channel (after the processor's normalisation,
        over its real patches)."""
        pixels = inputs["pixel_values"]
        if self.patchified:
            channels = self.config.num_channels
            real = inputs["pixel_attention_mask"][..., None, None].to(pixels.dtype)
            per_pixel = pixels.reshape(*pixels.shape[:2], -1, channels)  # the processor's (p, p, C) order
            mean = (per_pixel * real).sum((1, 2)) / (real.sum((1, 2)) * per_pixel.shape[2])
            return {**inputs, "pixel_values": mean[:, None, None, :].expand_as(per_pixel).reshape(pixels.shape)}
        return {"pixel_values": pixels.mean((-2, -1), keepdim=True).expand_as(pixels)}

    def patch_shares(self, inputs: dict, other: dict, grid: tuple[int, int]) -> torch.Tensor:
        """Per patch (reading order), the share of its pixels where two images' inputs differ."""
        first, second = inputs["pixel_values"][0], other["pixel_values"][0]
        if self.patchified:
            differs = (first != second).reshape(first.shape[0], -1, self.config.num_channels).any(-1).float()
            return differs.mean(-1)[: grid[0] * grid[1]]
        patch = self.config.patch_size
        differs = (first != second).any(0).float()
        return differs.reshape(grid[0], patch, grid[1], patch).mean((1, 3)).flatten()

    def prepare(self, items: list[_Image], settings=None) -> EncoderBatch:
        """A batch of images processed and traced, the explained tokens and outputs found, and the method's request."""
        names = [item.name for item in items]
        targets, foils = [item.target for item in items], [item.foil for item in items]
        model_inputs, mask, grids = self.encode([item.image for item in items])
        ids = torch.arange(mask.shape[1], device=self.device).expand(len(items), -1).contiguous()
        inputs = {"input_ids": ids, "attention_mask": mask, **model_inputs, "grids": grids}
        explained = self.explained_cells(inputs, [item.positions for item in items], names)
        call = ModelCall(self.runner, model_inputs, frame_masks={"decoder": mask})
        trace = trace_call(self.spec, call)
        return self.finish_batch(names, inputs, explained, targets, foils, trace, caller=lambda: call)

    def model_inputs(self, batch: EncoderBatch, rows: slice = slice(None)) -> dict:
        """What the model reads of a batch's images (of ``rows``)."""
        return {name: batch.inputs[name][rows] for name in MODEL_INPUTS if name in batch.inputs}

    def input_embeddings(self, batch: EncoderBatch) -> torch.Tensor:
        """What the gradient baselines attribute: the token embeddings the first block reads ``(B, T, D)``."""
        return first_block_input(self.runner, self.spec.decoder.layers[0].module, self.model_inputs(batch))

    def explained_logit(self, batch: EncoderBatch, row: int, cell: int, target: int, foil: int | None) -> nn.Module:
        """The explained logit of one image as a module of its token embeddings (Captum's forward function)."""
        head = self.spec.head if self.similarity else None
        inputs = self.model_inputs(batch, slice(row, row + 1))
        return _EmbeddedLogit(self.runner, self.spec.decoder.layers[0].module, inputs, target, foil, head)

    def baseline(self, baselines, embeds: torch.Tensor) -> torch.Tensor | None:
        if isinstance(baselines, str):
            raise ValueError(
                f"baselines={baselines!r}: a token baseline is for text; on images give a number (every embedding "
                f"coordinate) or a tensor broadcastable to (tokens, {embeds.shape[-1]}), or nothing (zeros)."
            )
        return super().baseline(baselines, embeds)

    def explained_positions(self, ids, mask, chosen, name: str) -> list[int]:
        if self.task == "sequence_classification" and self.explains_logit:
            return [0]  # the logit's row (a pooled read-out's shares are summed there)
        length = int(mask.sum())  # SigLIP 2's padding after the patches is not a token
        if chosen is None:
            return [0] if self.leading else list(range(length))
        what = "[CLS] and the like, then the patches" if self.leading else "its patches"
        return self.chosen_positions(chosen, length, name, f"tokens ({what})")

    def row_tokens(self, batch: EncoderBatch, row: int, cells) -> list:
        """Token labels of one image's ``cells``: the leading tokens, then ``r{row}c{column}`` per patch of its
        grid."""
        ids, columns = batch.inputs["input_ids"][row, cells].tolist(), batch.inputs["grids"][row][1]
        lead = len(self.leading)
        labels = [self.leading[idx] if idx < lead else f"r{(idx - lead) // columns}c{(idx - lead) % columns}"
                  for idx in ids]  # fmt: skip
        return token_list(labels, ids)

    def explained_tokens(self, batch: EncoderBatch, row: int, cells: list[int]) -> list:
        """A logit's label (or an image–text model's text), or the explained tokens' own labels (map methods)."""
        if not self.explains_logit or self.task is None:
            return self.row_tokens(batch, row, cells)
        if self.similarity:
            ids = batch.target_ids[row, cells].tolist()
            return token_list([self.texts[idx] for idx in ids], ids)
        return super().explained_tokens(batch, row, cells)

    def source_words(self, sequence, text) -> list[int]:
        """Each token is its own unit."""
        return list(range(len(sequence.source)))


class _EmbeddedLogit(nn.Module):
    """The explained logit (minus the foil's) as a function of the token embeddings the first block reads: the model
    runs on its pixels with that block's input replaced (what Captum attributes). An image–text model's similarity
    is its read-out (``head``) applied to the tower's final [CLS] state."""

    def __init__(self, runner: nn.Module, first: nn.Module, inputs: dict, target: int, foil: int | None,
                 head=None):  # fmt: skip
        super().__init__()
        self.runner, self.first, self.inputs, self.head = runner, first, inputs, head
        self.target, self.foil = target, foil

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        inputs = {name: value.expand(embeds.shape[0], *value.shape[1:]) for name, value in self.inputs.items()}
        with first_block_input_replaced(self.first, embeds):
            output = self.runner(**inputs)
        logits = (
            output.logits
            if self.head is None
            else head_logits(self.head, output.last_hidden_state, detach=False)[:, 0]
        )
        return logits[:, self.target] - (0 if self.foil is None else logits[:, self.foil])
