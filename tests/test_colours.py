"""One colour language (issue 54): every figure, HTML table, image overlay and the explorer draw maps on the shared
sequential scale and signed scores on the shared diverging one (:mod:`inseq_mixing.views.colours`), and say which."""

import json
import re
from pathlib import Path

import matplotlib
import pytest
import torch

import inseq_mixing
from inseq_mixing.testing import image_processor, synthetic_image, tiny_vision
from inseq_mixing.views import colours

VIEWS = Path(inseq_mixing.__file__).parent / "views"
#: matplotlib colour maps a view might name instead of the shared ones.
OTHER_MAPS = ("viridis", "plasma", "magma", "inferno", "cividis", "Blues", "Greens", "coolwarm", "bwr", "seismic")


def test_no_view_names_a_scale_of_its_own():
    for path in VIEWS.glob("*.py"):
        if path.name == "colours.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""cmap\s*=\s*["']""", text), path.name  # a literal colour map
        assert not [name for name in (*OTHER_MAPS, "RdBu", '"Reds"') if name in text], path.name
        assert not re.search(r"rgb\(\s*\d", text), path.name  # a literal HTML colour for scores
    template = (VIEWS / "explorer_template.html").read_text(encoding="utf-8")
    colour = template[template.index("function colour(") : template.index("function setup(")]
    assert "DATA.colours" in colour and not re.search(r"rgba\(\d", colour)  # the page's scale comes from Python


@pytest.fixture(scope="module")
def vision_outputs():
    model = tiny_vision("vit")
    image = synthetic_image(64)
    maps = inseq_mixing.load_model(model, "alti", processor=image_processor()).attribute(image, show_progress=False)
    signed = inseq_mixing.load_model(model, "alti_logit", processor=image_processor()).attribute(
        image, show_progress=False
    )
    return image, maps.sequence_attributions[0], signed.sequence_attributions[0]


def drawn_maps(figure) -> list[str]:
    """The colour maps of the figure's scalar images (an RGB photo under the scores has none)."""
    return [artist.get_cmap().name for axis in figure.axes for artist in axis.get_images()
            if artist.get_array().ndim == 2]  # fmt: skip


def test_every_figure_draws_on_the_shared_scales(vision_outputs):
    from inseq_mixing.views.figures import layer_figure
    from inseq_mixing.views.images import image_heatmap, layer_image_grid

    image, maps, signed = vision_outputs
    for sequence, expected in ((maps, colours.SEQUENTIAL), (signed, colours.DIVERGING)):
        figure = image_heatmap(sequence, image)
        assert set(drawn_maps(figure)) == {expected}
        legend = figure.axes[-1].get_ylabel()  # the colour bar names the scale
        assert colours.scale_name(expected == colours.DIVERGING) in legend
        matplotlib.pyplot.close(figure)
        named = image_heatmap(sequence, image, method="alti")  # the method in the default title
        assert named.axes[0].get_title().startswith("alti, explained: ")
        matplotlib.pyplot.close(named)
    figure = layer_image_grid(maps, image) if maps.source_attributions.dim() == 3 else None
    if figure is not None:
        assert colours.SEQUENTIAL in drawn_maps(figure)
    for values, expected in ((torch.rand(3, 2, 2), colours.SEQUENTIAL), (torch.randn(3, 2, 2), colours.DIVERGING)):
        figure = layer_figure(values, ["a", "b", "c"], ["x", "y"])
        assert set(drawn_maps(figure)) == {expected}
        matplotlib.pyplot.close(figure)


def test_html_tables_and_the_explorer_use_the_shared_colours(vision_outputs):
    from inseq_mixing.views.explorer import explore
    from inseq_mixing.views.report import cell_style, colour_legend

    assert cell_style(0.5, 1.0, signed=False).startswith(f"background:{colours.css_colour(0.5, 1.0, False)}")
    assert colours.css_colour(1.0, 1.0, False) == "rgb({},{},{})".format(*colours.RAISE)  # full red at the top
    assert colours.css_colour(-1.0, 1.0, True) == "rgb({},{},{})".format(*colours.LOWER)  # full blue
    assert colours.css_colour(0.0, 1.0, True) == "rgb(255,255,255)"
    assert colours.scale_name(True) in colour_legend(True, 1.0, False)
    image, maps, _ = vision_outputs
    page = explore([inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())
                    .attribute(image, show_progress=False)], None, images=[image])  # fmt: skip
    data = json.loads(re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>', page, re.S)[1])
    assert data["colours"] == {"raise": list(colours.RAISE), "lower": list(colours.LOWER),
                               "signed": colours.scale_name(True), "map": colours.scale_name(False)}  # fmt: skip
