"""Griffe extension for this site: the library's docstrings use Sphinx roles
(:class:`~hybridmem.Memory`, :meth:`close`) and ``text::`` literal blocks; shown as Markdown, a
role becomes a plain code span and ``::`` a colon. Loaded by mkdocs.yml; not part of the package."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1]}`" if match.group(1) else f"`{target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_code, obj.docstring.value)
            obj.docstring.value = re.sub(r"(?<=\S)::$", ":", text, flags=re.M)
