"""The JSON Schemas (draft 2020-12) of pipeplan's files, kept in ``schemas/`` and installed as ``pipeplan.schemas``.

``graph``, ``cluster`` and ``plan`` describe the files of the spec field by field with
units and meanings; ``result`` the solver record a plan carries in its ``solver``
field (``plan`` refers to it as ``urn:pipeplan:schemas:result``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SCHEMA_NAMES = ("graph", "cluster", "plan", "result")
"""The schemas, by the name ``pipeplan schema NAME`` takes."""


def schema_text(name: str) -> str:
    """The text of schema ``name`` (one of :data:`SCHEMA_NAMES`).

    Examples
    --------
    >>> '"$schema": "https://json-schema.org/draft/2020-12/schema"' in schema_text("plan")
    True
    """
    if name not in SCHEMA_NAMES:
        raise KeyError(name)
    return resources.files("pipeplan.schemas").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def schema(name: str) -> dict[str, Any]:
    """Schema ``name`` as a JSON object."""
    return json.loads(schema_text(name))
