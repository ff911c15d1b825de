"""An imported model cut into units: order, edges, ties, model inputs and the checks on them.

:func:`trace_model` selects the units (:mod:`pipeplan.models.units`), records the
dataflow at two batch sizes (:mod:`pipeplan.models.dataflow`), puts the units in the
order they first run and refuses what no pipeline stage could hold: Parameters
outside every unit, glue code reading a Parameter or doing more than 1 % of the
FLOPs.  With ``trace="export"`` or ``"both"`` the edges are also found with
``torch.export`` (:mod:`pipeplan.models.export_edges`) and any disagreement becomes
a warning naming the edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeplan.models.dataflow import MAX_GLUE_SHARE, Recording, UnitRunsTwice, record
from pipeplan.models.errors import InputError
from pipeplan.models.spec import Call, UserModel
from pipeplan.models.units import select_units

#: The two batch sizes the dataflow is recorded at (two, so sizes that grow with the batch show).
RECORD_SIZES = (2, 3)

TRACES = ("eager", "export", "both")
"""``--trace`` choices."""


@dataclass
class ImportedUnit:
    """One unit of an imported model."""

    name: str
    """Qualified name of the submodule (``transformer.h.3``); the layer's name."""
    module: nn.Module
    """The submodule."""
    inputs: tuple[int, ...]
    """Earlier units whose outputs it reads (directly or through glue code), ascending."""
    reads_input: tuple[str, ...]
    """The model inputs it reads (``"0"``, ``"attention_mask"``)."""
    tied_to: int | None
    """The first earlier unit sharing a Parameter with it, or ``None``."""
    tied_bytes: int
    """Bytes of its Parameters that an earlier unit holds too."""
    out_fixed: bool = False
    """Whether its output does not grow with the batch (a rotary table)."""


@dataclass
class ImportedModel:
    """A user model as units in run order, with its dataflow."""

    user: UserModel
    """The model and its example and loss."""
    units: list[ImportedUnit]
    """Units in the order they first run (a topological order)."""
    output_units: tuple[int, ...]
    """Units the model's output is computed from."""
    flops: dict[str, float]
    """Forward FLOPs at the larger recorded size: ``"total"``, ``"glue"`` and per unit."""
    warnings: list[str] = field(default_factory=list)
    """What the user should know (units dropped, traces disagreeing)."""
    request: Any = None
    """The :class:`~pipeplan.models.model_options.ModelRequest` that built it, when named on the command line."""

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def device(self) -> str:
        """The device type the model's parameters are on (``meta``: built without weights)."""
        return next((p.device.type for p in self.user.module.parameters()), "cpu")

    def edges(self) -> list[tuple[int, int]]:
        """``(u, v)``: unit ``v`` reads unit ``u``'s output."""
        return sorted((u, v) for v, unit in enumerate(self.units) for u in unit.inputs)

    def unit_calls(self, n: int, seed: int = 0) -> tuple[list[Call], list[Any], Any]:
        """Each unit's ``(args, kwargs)`` and output for a batch of ``n`` samples, and the model output."""
        names = [u.name for u in self.units]
        with torch.device(self.device):  # a meta model gets meta inputs, as when it was traced
            call = self.user.example(n, seed)
        with torch.no_grad():
            rec = record(self.user.module, names, call, self.user.spec)
            output = _model_output(self.user, call)
        return [rec.calls[i] for i in range(len(names))], [rec.outputs[i] for i in range(len(names))], output

    def unique_param_bytes(self) -> int:
        """Bytes of the model's Parameters, a shared one counted once."""
        return sum(p.numel() * p.element_size() for p in self.user.module.parameters())


def _model_output(user: UserModel, call: Call) -> Any:
    return user.run(call)


def trace_model(user: UserModel, units: str = "auto", trace: str = "eager") -> ImportedModel:
    """Find the units of ``user``'s model and the dataflow between them.

    Parameters
    ----------
    user : UserModel
        From :func:`pipeplan.models.spec.resolve_user_model`.
    units : str
        ``"auto"`` or comma-separated qualified names (see :func:`pipeplan.models.units.select_units`).
    trace : str
        ``"eager"`` (hooks and tagged tensors), ``"export"`` (``torch.export``) or
        ``"both"`` (eager edges, cross-checked with export).

    Returns
    -------
    ImportedModel

    Raises
    ------
    InputError
        Bad unit names, a unit that runs twice or never (when named explicitly), a
        failing forward pass, Parameters outside every unit, glue code reading a
        Parameter or above 1 % of the FLOPs, or (``trace="export"``) a model export
        cannot trace.
    """
    if trace not in TRACES:
        raise InputError("-", "--trace", f"unknown trace {trace!r}; valid: {', '.join(TRACES)}")
    module, spec = user.module, user.spec
    names = select_units(module, units, spec)
    warnings: list[str] = []
    try:
        small, large = _record_units(user, names, auto=units == "auto", warnings=warnings)
    except InputError as exc:
        if exc.where != "forward" or not user.forward_hint:
            raise
        raise InputError(exc.file, exc.where, f"{exc.what}; {user.forward_hint}") from exc
    names, small, large = _drop_unrun(names, small, large, explicit=units != "auto", spec=spec, warnings=warnings)
    _check_parameters(module, names, large, spec)
    _check_glue(large, spec)
    imported = _build(user, names, small, large, warnings)
    if trace != "eager":
        from pipeplan.models.export_edges import compare_edges

        compare_edges(imported, trace, warnings)
    return imported


def _record_units(user: UserModel, names: list[str], *, auto: bool,
                  warnings: list[str]) -> tuple[Recording, Recording]:
    """The recordings at both sizes; automatic units without parameters that run twice are left to the glue."""
    modules = dict(user.module.named_modules())
    while True:
        try:
            recordings = []
            for n in RECORD_SIZES:
                call = user.example(n)
                with torch.no_grad():
                    recordings.append(record(user.module, names, call, user.spec))
            return recordings[0], recordings[1]
        except UnitRunsTwice as exc:
            name = names[exc.unit]
            if not auto or any(True for _ in modules[name].parameters()):
                raise
            warnings.append(f"left out of the units: {name} (runs more than once per forward pass and holds no "
                            "parameters, so it runs as glue code)")
            names.remove(name)


def _drop_unrun(names: list[str], small: Recording, large: Recording, *, explicit: bool, spec: str,
                warnings: list[str]) -> tuple[list[str], Recording, Recording]:
    unrun = [names[i] for i in range(len(names)) if i not in large.calls]
    if not unrun:
        return names, small, large
    if explicit:
        raise InputError(spec, "--units", f"{', '.join(unrun)} never run(s) in the forward pass on the example; "
                                          "name only submodules the forward calls")
    warnings.append(f"left out of the units: {', '.join(unrun)} (never run on the example)")
    keep = [n for n in names if n not in unrun]
    return keep, _renumber(small, names, keep), _renumber(large, names, keep)


def _renumber(rec: Recording, old: list[str], new: list[str]) -> Recording:
    index = {old.index(n): i for i, n in enumerate(new)}

    def remap(sources: set[Any]) -> set[Any]:
        return {index[s] if isinstance(s, int) else s for s in sources if not isinstance(s, int) or s in index}

    return Recording([index[i] for i in rec.order if i in index],
                     {index[i]: remap(s) for i, s in rec.sources.items() if i in index},
                     {index[i]: c for i, c in rec.calls.items() if i in index},
                     {index[i]: o for i, o in rec.outputs.items() if i in index},
                     remap(rec.output_sources), rec.glue_params, rec.flops, rec.glue_ops)


def _check_parameters(module: nn.Module, names: list[str], rec: Recording, spec: str) -> None:
    modules = dict(module.named_modules())
    inside = {id(p) for n in names for p in modules[n].parameters()}
    outside = [n for n, p in module.named_parameters() if id(p) not in inside]
    if outside:
        shown = ", ".join(outside[:6]) + (f" and {len(outside) - 6} more" if len(outside) > 6 else "")
        raise InputError(spec, "--units", f"parameters outside every unit: {shown}; no stage would hold them: "
                                          "add their modules to --units")


def _check_glue(rec: Recording, spec: str) -> None:
    if rec.glue_params:
        raise InputError(spec, "forward", f"code outside every unit (the model's own forward, or a submodule that "
                                          f"is no unit) reads {', '.join(rec.glue_params)}; no stage would hold "
                                          "that computation: move it into a unit (or add its module to --units)")
    total = rec.flops["total"]
    glue = sum(rec.glue_ops.values())
    if total > 0 and glue > MAX_GLUE_SHARE * total:
        ops = ", ".join(f"{op} {v / total:.1%}" for op, v in sorted(rec.glue_ops.items(), key=lambda kv: -kv[1]))
        raise InputError(spec, "forward", f"code outside every unit does {glue / total:.1%} of the forward FLOPs "
                                          f"(more than {MAX_GLUE_SHARE:.0%}: {ops}); move it into a submodule")


def _build(user: UserModel, names: list[str], small: Recording, large: Recording,
           warnings: list[str]) -> ImportedModel:
    order = large.order  # run order -> original index
    position = {old: new for new, old in enumerate(order)}
    modules = dict(user.module.named_modules())
    if [position[i] for i in small.order] != list(range(len(order))):
        warnings.append("the units ran in another order at the smaller recorded batch size")
    seen_params: dict[int, int] = {}  # Parameter id -> first unit (new index) holding it
    units = []
    for new, old in enumerate(order):
        sources = large.sources[old] | small.sources.get(old, set())
        if sources != large.sources[old]:
            warnings.append(f"{names[old]} reads other tensors at batch {RECORD_SIZES[0]} than at {RECORD_SIZES[1]}")
        inputs = tuple(sorted(position[s] for s in sources if isinstance(s, int)))
        reads = tuple(sorted(s.split(":", 1)[1] for s in sources if isinstance(s, str)))
        tied_to, tied = None, 0
        for p in modules[names[old]].parameters():
            if id(p) in seen_params and seen_params[id(p)] != new:
                tied_to = seen_params[id(p)] if tied_to is None else min(tied_to, seen_params[id(p)])
                tied += p.numel() * p.element_size()
            else:
                seen_params.setdefault(id(p), new)
        fixed = not _grows(small.outputs[old], large.outputs[old])
        units.append(ImportedUnit(names[old], modules[names[old]], inputs, reads, tied_to, tied, fixed))
    flops = {"total": large.flops["total"], "glue": sum(large.glue_ops.values())}
    flops.update({names[old]: large.flops[names[old]] for old in order})
    output_units = tuple(sorted(position[s] for s in large.output_sources if isinstance(s, int)))
    return ImportedModel(user, units, output_units, flops, warnings)


def _grows(small: Any, large: Any) -> bool:
    """Whether an output's size depends on the batch size (any tensor leaf's shape differs)."""
    a = [t.shape for t in pytree.tree_leaves(small) if isinstance(t, torch.Tensor)]
    b = [t.shape for t in pytree.tree_leaves(large) if isinstance(t, torch.Tensor)]
    return a != b


def describe(model: ImportedModel) -> str:
    """The units, edges, ties and warnings as text (``profile --dry-run``)."""
    lines = [f"{model.name}: {len(model.units)} units, {model.unique_param_bytes():,} parameter bytes, "
             f"glue {model.flops['glue'] / model.flops['total']:.2%} of forward FLOPs" if model.flops["total"] else
             f"{model.name}: {len(model.units)} units, {model.unique_param_bytes():,} parameter bytes"]
    if model.user.built:
        lines.append(f"  builds {model.user.built}")
    for i, unit in enumerate(model.units):
        reads = [model.units[u].name for u in unit.inputs] + [f"input:{r}" for r in unit.reads_input]
        notes = []
        if unit.tied_to is not None:
            notes.append(f"tied to {model.units[unit.tied_to].name} ({unit.tied_bytes:,} bytes)")
        if unit.out_fixed:
            notes.append("output does not grow with the batch")
        params = sum(p.numel() * p.element_size() for p in unit.module.parameters())
        lines.append(f"  {i:>3} {unit.name:<28} params {params:>12,}  reads {', '.join(reads) or '-'}"
                     + (f"  [{'; '.join(notes)}]" if notes else ""))
    lines.append("edges: " + " ".join(f"{u}->{v}" for u, v in model.edges()))
    lines.extend(f"warning: {w}" for w in model.warnings)
    return "\n".join(lines)
