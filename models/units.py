"""Which submodules of a model are its partition units (``--units auto|FQN,...``).

``auto``: the model's *trunks*, one unit per item, plus every sibling module on the
path from the root to each trunk (GPT-2: ``transformer.wte, transformer.wpe,
transformer.drop, transformer.h.0, ..., transformer.ln_f, lm_head``).  A trunk is an
outermost ``nn.ModuleList`` (one inside no other ModuleList) holding at least half as
many parameters as the largest such list: GPT-2's ``transformer.h``, and both
``encoder.block`` and ``decoder.block`` of T5 (a list inside a block, such as T5's
``block.0.layer``, is never one).  Without parameters in any list, the longest list
is the trunk; with no ModuleList, the root's children are the units.  A candidate
that is a submodule of another candidate too (a shared ``Linear`` that two blocks
hold) is no unit: the units holding it share its parameters (a tie).  An explicit
list names submodules by their qualified names; a ModuleList's name stands for each
of its items.  Either way the units are later put in the order they first run, and
:func:`pipeplan.models.imported.trace_model` leaves out an automatic unit without
parameters that runs more than once per forward (T5's ``dropout``): it runs as glue.
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
    trunks = trunk_lists(model)
    if not trunks:
        return [name for name, _ in model.named_children()]
    out: list[str] = []

    def expand(module: nn.Module, prefix: str) -> None:
        for child, sub in module.named_children():
            full = f"{prefix}.{child}" if prefix else child
            if full in trunks:
                out.extend(f"{full}.{item}" for item, _ in sub.named_children())
            elif any(t.startswith(full + ".") for t in trunks):
                expand(sub, full)
            else:
                out.append(full)

    expand(model, "")
    return _unshared(model, out)


def trunk_lists(model: nn.Module) -> list[str]:
    """Qualified names of the model's trunks (see the module docstring), in definition order.

    Examples
    --------
    >>> enc = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
    >>> m = nn.Sequential(nn.Embedding(9, 4), enc, nn.ModuleList([nn.ReLU(), nn.ReLU(), nn.ReLU()]), nn.Linear(4, 1))
    >>> trunk_lists(m)  # the longer list holds no parameters
    ['1']
    """
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) and name]
    outer = [(name, m) for name, m in lists
             if not any(name.startswith(other + ".") for other, _ in lists if other != name)]
    if not outer:
        return []
    weights = {name: sum(p.numel() for p in m.parameters()) for name, m in outer}
    heaviest = max(weights.values())
    if heaviest == 0:  # no parameters anywhere: the longest list (the first of equal length)
        return [max(outer, key=lambda item: len(item[1]))[0]]
    return [name for name, _ in outer if 2 * weights[name] >= heaviest]


def _unshared(model: nn.Module, names: list[str]) -> list[str]:
    """``names`` without a module that another candidate holds inside it, or that an earlier name is."""
    modules = dict(model.named_modules(remove_duplicate=False))
    inside: dict[int, set[str]] = {}
    for name in names:
        for sub in modules[name].modules():
            if sub is not modules[name]:
                inside.setdefault(id(sub), set()).add(name)
    seen: set[int] = set()
    out = []
    for name in names:
        module = modules[name]
        if id(module) in seen or inside.get(id(module), set()) - {name}:
            continue
        seen.add(id(module))
        out.append(name)
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
