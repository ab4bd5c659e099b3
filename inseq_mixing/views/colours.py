"""One colour language for every view: a map (how much each token mixes in, no sign) on a **sequential** scale from
white at 0 to red at the largest score; a signed contribution (the logit methods, the gradient baselines) on a
**diverging** scale centred on 0, red where it raises the explained output and blue where it lowers it. The same red
in both, so that red always means "more of what is explained". Every figure (matplotlib's ``Reds`` and ``RdBu_r``),
HTML table, image overlay and the explorer draw with what is here, and every legend names the scale.
"""

#: matplotlib's names of the two scales.
SEQUENTIAL = "Reds"
DIVERGING = "RdBu_r"
#: The ends of the HTML scales (RGB): the red of "raises" / "more", the blue of "lowers".
RAISE = (211, 47, 47)
LOWER = (25, 118, 210)


def colour_map(signed: bool) -> str:
    """matplotlib's name of the scale for signed scores or maps."""
    return DIVERGING if signed else SEQUENTIAL


def scale_name(signed: bool) -> str:
    """What a legend calls the scale."""
    if signed:
        return "diverging scale: red raises the explained output, blue lowers it, white at 0"
    return "sequential scale: white at 0, red at the largest score (a map: no sign)"


def css_colour(value: float, top: float, signed: bool) -> str:
    """The HTML colour of ``value`` on a scale whose full colour is at ``|value| = top``: white mixed with red (or,
    for a negative signed value, blue) in proportion to ``|value| / top``."""
    strength = 0.0 if top <= 0 else min(1.0, abs(value) / top)
    end = LOWER if signed and value < 0 else RAISE
    red, green, blue = (round(255 + (channel - 255) * strength) for channel in end)
    return f"rgb({red},{green},{blue})"
