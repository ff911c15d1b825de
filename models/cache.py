"""A small JSON cache for profiles, keyed by everything that changes a measurement."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import atomic_write_text, dumps, load_json


def cache_dir() -> Path:
    """``$PIPEPLAN_CACHE`` if set, else ``~/.cache/pipeplan``."""
    env = os.environ.get("PIPEPLAN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pipeplan"


def machine() -> dict[str, str]:
    """What identifies the machine a measurement was taken on."""
    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": str(os.cpu_count())}


def cache_key(kind: str, payload: dict[str, Any]) -> str:
    """A stable hex key of ``payload`` plus the torch version and the machine.

    Examples
    --------
    >>> cache_key("x", {"a": 1}) == cache_key("x", {"a": 1})
    True
    """
    blob = json.dumps({"kind": kind, "payload": payload, "machine": machine()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def cache_path(kind: str, key: str) -> Path:
    """Where the entry ``key`` of ``kind`` lives."""
    return cache_dir() / f"{kind}-{key}.json"


def load_cached(kind: str, key: str) -> Any | None:
    """The cached JSON value, or ``None`` if absent or unreadable (then it is recomputed)."""
    path = cache_path(kind, key)
    if not path.is_file():
        return None
    try:
        return load_json(path)
    except InputError:
        return None


def store_cached(kind: str, key: str, value: Any) -> Path:
    """Write ``value`` atomically; a cache that cannot be written is not an error."""
    path = cache_path(kind, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, dumps(value))
    except (OSError, InputError):  # atomic_write_text reports an unwritable folder as InputError
        pass
    return path
