"""Repair the event names that torch's Chrome-trace writers leave unescaped, so that a trace is never lost
because of a name.

torch's C++ (Kineto) writer puts a ``record_function`` name between quotes as it is: a ``"`` in it makes the file
invalid JSON (pytorch/pytorch#146900). It also writes ``\\`` as ``/``, drops newlines and writes a name holding a
tab, another control character or any non-ASCII character as ``unknown``; those names stay valid JSON and cannot
be restored from the file. The legacy autograd-profiler writer (``EventList.export_chrome_trace``) escapes
nothing either. :func:`repair_names` re-escapes such names in the two layouts those writers produce:

* Kineto's, one field per line: ``    "name": "<raw>",`` (the raw name has no line break, as the writer drops
  them), repaired from the line's ``"name": "`` to its last ``",``;
* the legacy one, one event after another on one line: ``{"name": "<raw>", "ph": "X", ...``, repaired up to the
  first ``", "ph": "`` that follows (a name holding that very text stays ambiguous and is not repaired).

Only names that are not already valid JSON string content are touched.
"""

from __future__ import annotations

import json
import re

_KINETO_NAME = re.compile(r'^(?P<head>[ \t]*"name": ")(?P<value>.*)(?P<tail>",[ \t]*\r?)$', re.MULTILINE)
"""A ``"name"`` line of Kineto's C++ writer: the value runs to the line's last ``",``."""
_LEGACY_NAME = re.compile(r'(?P<head>\{"name": ")(?P<value>.*?)(?P<tail>", "ph": ")', re.DOTALL)
"""A ``"name"`` field of the legacy autograd-profiler writer: the value (raw, newlines included) runs to the next
``", "ph": "``."""


def _valid(value: str) -> bool:
    try:
        json.loads(f'"{value}"')
    except ValueError:
        return False
    return True


def _escape(value: str) -> str:
    """``value`` as JSON string content (without the quotes)."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


def repair_names(text: str) -> tuple[str, list[str]]:
    """Re-escape the ``"name"`` values of ``text`` that are not valid JSON string content.

    Args:
        text: a Chrome trace as written by torch's C++ writer or the legacy autograd-profiler writer.

    Returns:
        The repaired text and the names repaired (each once, in order of first appearance).
    """
    repaired: dict[str, None] = {}

    def fix(match: re.Match[str]) -> str:
        value = match["value"]
        if _valid(value):
            return match.group(0)
        repaired[value] = None
        return f"{match['head']}{_escape(value)}{match['tail']}"

    text = _KINETO_NAME.sub(fix, text)
    if not repaired:
        text = _LEGACY_NAME.sub(fix, text)
    return text, list(repaired)


def name_list(names: list[str], *, limit: int = 10) -> str:
    """The first ``limit`` names as Python literals (control characters visible), then how many more."""
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def repaired_names_warning(names: list[str]) -> str:
    """The one warning that says which names were repaired."""
    return (
        f"{len(names)} event name(s) that torch's trace writer left unescaped (invalid JSON, pytorch/pytorch#146900) "
        f"were repaired to read the trace: {name_list(names)}."
    )
