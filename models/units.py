"""Which submodules of a model are its partition units (``--units auto|FQN,...``).

``auto``: the longest ``nn.ModuleList`` (the first of equal length), one unit per
item, plus every sibling module on the path from the root to it (GPT-2:
``transformer.wte, transformer.wpe, transformer.drop, transformer.h.0, ...,
transformer.ln_f, lm_head``).  With no ModuleList, the root's children.  An explicit
list names submodules by their qualified names; a ModuleList's name stands for each
of its items.  Either way the units are later put in the order they first run.
"""

from __future__ import annotations

import difflib

from torch import nn

from pipeplan.models.errors import InputError


def select_units(model: nn.Module, units: str = "auto", spec: str = "-") -> list[str]:
    """Qualified names of the unit modules (in module-definition order).

    Parameters
    ----------
    model : nn.Module
        The whole model.
    units : str
        ``"auto"`` or comma-separated qualified names.
    spec : str
        The model's spec, for error messages.

    Returns
    -------
    list of str

    Raises
    ------
    InputError
        A name that is not a submodule (with the closest names), a repeated name,
        or two units of which one contains the other.

    Examples
    --------
    >>> m = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.ReLU(), nn.ReLU()]), nn.Linear(2, 1))
    >>> select_units(m)
    ['0', '1.0', '1.1', '2']
    >>> select_units(m, "0,1")
    ['0', '1.0', '1.1']
    """
    names = _auto_units(model) if units == "auto" else _explicit_units(model, units, spec)
    _check_disjoint(names, spec)
    return names


def _auto_units(model: nn.Module) -> list[str]:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) and name]
    if not lists:
        return [name for name, _ in model.named_children()]
    longest, modules = max(lists, key=lambda item: len(item[1]))  # max keeps the first of equal length
    path = longest.split(".")
    out: list[str] = []
    parent = model
    for depth, step in enumerate(path):
        prefix = ".".join(path[:depth])
        for child, module in parent.named_children():
            full = f"{prefix}.{child}" if prefix else child
            if child == step:
                if depth == len(path) - 1:
                    out.extend(f"{full}.{item}" for item, _ in module.named_children())
            else:
                out.append(full)
        parent = getattr(parent, step)
    return out


def _explicit_units(model: nn.Module, units: str, spec: str) -> list[str]:
    known = dict(model.named_modules())
    out: list[str] = []
    for name in (part.strip() for part in units.split(",")):
        if name not in known or not name:
            close = difflib.get_close_matches(name, [n for n in known if n], n=3)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise InputError(spec, "--units", f"{name!r} is not a submodule of {type(model).__name__}{hint}")
        module = known[name]
        if isinstance(module, nn.ModuleList):
            out.extend(f"{name}.{item}" for item, _ in module.named_children())
        else:
            out.append(name)
    return out


def _check_disjoint(names: list[str], spec: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(spec, "--units", f"{name!r} is named twice")
        seen.add(name)
    for name in names:
        for other in names:
            if other != name and name.startswith(other + "."):
                raise InputError(spec, "--units", f"units overlap: {other!r} contains {name!r}; name one of them")
