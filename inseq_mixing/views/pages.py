"""What every page this package writes shares: data embedded for a page's script as JSON that no string in it can
break out of, and templates filled once, by position.

A JSON island (``<script type="application/json">``) ends at the first ``</script``, and a ``<!--`` followed by
``<script`` inside it changes how the browser looks for that end; escaping ``</`` alone leaves the second open (a
token ``<!--<script>`` blanks the page). :func:`script_json` writes every ``<``, ``>`` and ``&`` as a JSON escape
(``\\u003c`` ...), which ``JSON.parse`` reads back as the same characters. :func:`fill_template` substitutes each
placeholder once, where it stands in the template: a value that contains another placeholder's name (a title holding
``__DATA__``) stays text.
"""

from __future__ import annotations

import json
import re

#: Characters written as JSON escapes inside a page's script (the line separators end a line in old JavaScript).
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029]")


def script_json(data) -> str:
    """``data`` as JSON to embed in a page's ``<script type="application/json">`` (no NaN: JSON has none)."""
    text = json.dumps(data, allow_nan=False, ensure_ascii=False)
    return _SCRIPT_UNSAFE.sub(lambda match: _SCRIPT_ESCAPES[match.group()], text)


def fill_template(template: str, values: dict[str, str]) -> str:
    """``template`` with each placeholder of ``values`` replaced by its value, in one pass over the template (values
    are never searched for placeholders).

    Raises:
        ValueError: A placeholder that the template does not contain.
    """
    missing = [name for name in values if name not in template]
    if missing:
        raise ValueError(f"The template has no placeholder {missing}.")
    pattern = re.compile("|".join(re.escape(name) for name in sorted(values, key=len, reverse=True)))
    return pattern.sub(lambda match: values[match.group()], template)
