"""Kueue configurations the tests share.

``TUTORIAL`` is the example in ``shared.kueue.config``'s docstring (the GKE multislice tutorial's
queues), so the documented example is the one every Kueue test parses, renders and applies.
"""

from __future__ import annotations

import textwrap

from shared.kueue import config


def _docstring_example() -> str:
    doc = config.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return "\n" + textwrap.dedent("\n".join(lines)).strip("\n") + "\n"


TUTORIAL = _docstring_example()
