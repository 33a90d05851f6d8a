"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~ampsafe.RiskPath```,
``:meth:`x```) read as Markdown code spans (`RiskPath`, `x`), and their double-backtick literals as single ones."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")
SHORTENED = re.compile(r"`~([\w.]+)`")


def as_markdown(text: str) -> str:
    text = ROLE.sub(lambda m: "`" + m.group(1) + "`", text)
    text = SHORTENED.sub(lambda m: "`" + m.group(1).rsplit(".", 1)[-1] + "`", text)
    return text.replace("``", "`")


class SphinxRolesAsCode(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = as_markdown(obj.docstring.value)
