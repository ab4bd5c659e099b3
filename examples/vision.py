"""Vision: context mixing over image patches in ViT, DeiT and DINOv2 classifiers and CLIP's image–text similarity.

Runs offline: the models are small ones built from configs with random weights (24 × 24 pixels, patches of 8), the
image a synthetic gradient with a bright square written to a PNG file. With the hub, swap in
``inseq_mixing.load_model("google/vit-base-patch16-224", "alti_logit")`` (its image processor is loaded with it).

    python examples/vision.py [--out out/vision.png]   # also out/vision_layers.png, vision_clip.png, vision.html
"""

import argparse
from pathlib import Path

from PIL import Image

import inseq_mixing
from inseq_mixing.testing import image_processor, synthetic_image, tiny_clip, tiny_vision
from inseq_mixing.views.images import image_heatmap, image_report, layer_image_grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/vision.png")
    out = Path(parser.parse_args().out)
    out.parent.mkdir(parents=True, exist_ok=True)
    picture = out.with_name("image.png")
    Image.fromarray(synthetic_image(64)).save(picture)

    vit, processor = tiny_vision("vit"), image_processor()
    # ALTI-logit: the predicted label's logit split over [CLS] and the 3 × 3 patches, plus terms no token carries
    result = inseq_mixing.load_model(vit, "alti_logit", processor=processor).attribute(str(picture))
    sequence = result.sequence_attributions[0]
    print("units:", [token.token for token in sequence.source])
    total = sequence.source_attributions.sum() + sum(
        value.sum() for name, value in sequence.step_scores.items() if name.startswith("unattributed_")
    )
    print(f"explained {sequence.target[0].token!r}: parts add up to the logit:",
          bool(abs(total - sequence.step_scores["logit"].sum()) < 1e-4))  # fmt: skip
    image_heatmap(sequence, picture, path=out)
    print("heatmap over the image:", out)

    # Value zeroing on DeiT ([CLS] and its distillation token are units of their own), one map per layer
    deit = inseq_mixing.load_model(tiny_vision("deit"), "value_zeroing", processor=processor)
    sequence = deit.attribute(str(picture), show_progress=False, per_layer=True).sequence_attributions[0]
    layers = out.with_name(out.stem + "_layers.png")
    layer_image_grid(sequence, picture, path=layers)
    print("[CLS]'s mixing per layer:", layers)
    # DINOv2's classifier reads [CLS] beside the mean of the patches: each read position's share, summed, is the logit
    dinov2 = inseq_mixing.load_model(tiny_vision("dinov2"), "decompx", processor=processor)
    pooled = dinov2.attribute(str(picture), show_progress=False)
    print("DINOv2:", pooled.info["explained"])

    # CLIP: the image–text similarity of the image with a text, against another text
    clip, both = tiny_clip()
    similarity = inseq_mixing.load_model(clip, "alti_logit", processor=both)
    contrast = similarity.attribute(str(picture), targets="the cat sat", foils="a dog ran", show_progress=False)
    sequence = contrast.sequence_attributions[0]
    gap = float(sequence.step_scores["contrast_logits_diff"])
    print(f"CLIP: similarity('the cat sat') − similarity('a dog ran') = {gap:.4f}")
    image_heatmap(sequence, picture, path=out.with_name(out.stem + "_clip.png"))

    page = out.with_suffix(".html")
    image_report(result, [picture], page)
    print("a page of the figures, each with its colour scale in words:", page)


if __name__ == "__main__":
    main()
