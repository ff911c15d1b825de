"""The units' edges as ``torch.export`` sees them, to cross-check the eager recorder.

``torch.export.export(model, args, kwargs, strict=False)`` gives one graph of aten
operations, each tagged with the stack of modules it ran in
(``nn_module_stack``).  An operation belongs to the unit on its stack; every other
operation is glue, whose sources are those of its operands.  A unit reads unit
``u`` when one of its operations has an operand computed in ``u`` or by glue from
``u``.  Export cannot trace data-dependent control flow (``if x.sum() > 0``); then
the eager edges stand alone, with a warning.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

from pipeplan.models.errors import InputError


def export_sources(model: torch.nn.Module, names: list[str], call: tuple[tuple[Any, ...], dict[str, Any]]
                   ) -> dict[int, set[Any]]:
    """Per unit index (into ``names``): its sources, as :func:`pipeplan.models.dataflow.record` names them.

    Raises
    ------
    RuntimeError (or any exception torch.export raises)
        If the model cannot be exported.
    """
    args, kwargs = call
    with _quiet():
        program = torch.export.export(model, args, kwargs, strict=False)
    index = {name: i for i, name in enumerate(names)}
    labels = _input_labels(args, kwargs, list(program.graph_signature.user_inputs))
    owner: dict[str, int | None] = {}
    glue: dict[str, set[Any]] = {}
    sources: dict[int, set[Any]] = {i: set() for i in range(len(names))}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            owner[node.name] = None
            glue[node.name] = {labels[node.name]} if node.name in labels else set()
            continue
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        unit = next((index[path] for path, _ in stack.values() if path in index), None)
        owner[node.name] = unit
        found: set[Any] = set()
        for arg in node.all_input_nodes:
            source_unit = owner.get(arg.name)
            if source_unit is not None and source_unit != unit:
                found.add(source_unit)
            elif source_unit is None:
                found |= glue.get(arg.name, set())
        if unit is None:
            glue[node.name] = found
        else:
            sources[unit] |= found
            glue[node.name] = set()
    return sources


@contextmanager
def _quiet() -> Iterator[None]:
    """torch's loggers silenced: a failed export logs the partial graph, the error says enough."""
    logging.disable(logging.CRITICAL)
    try:
        with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _input_labels(args: tuple[Any, ...], kwargs: dict[str, Any], placeholders: list[str]) -> dict[str, str]:
    leaves = pytree.tree_flatten_with_path((args, kwargs))[0]
    labels = []
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        first, key = path[0], path[1]
        top = key.idx if first.idx == 0 else key.key  # type: ignore[attr-defined]
        labels.append(f"input:{top}")
    return dict(zip(placeholders, labels)) if len(labels) == len(placeholders) else {}


def compare_edges(model: Any, trace: str, warnings: list[str]) -> None:
    """Cross-check ``model``'s (an :class:`~pipeplan.models.imported.ImportedModel`) edges with export.

    ``trace="export"`` refuses a model export cannot trace; ``"both"`` warns.  A
    disagreement is a warning naming the edges each method alone found.
    """
    names = [u.name for u in model.units]
    try:
        found = export_sources(model.user.module, names, model.user.example(2))
    except Exception as exc:  # export's failures are many types; each means "cannot trace"
        first = (str(exc).strip().splitlines() or [""])[0]
        reason = f"{type(exc).__name__}: {first if len(first) <= 120 else first[:117] + '...'}"
        if trace == "export":
            raise InputError(model.user.spec, "--trace", f"torch.export cannot trace the model ({reason}); "
                                                         "use --trace eager") from exc
        warnings.append(f"torch.export cannot trace the model ({reason}); the eager edges stand unchecked")
        return
    eager = {(u, v) for u, v in model.edges()}
    exported = {(u, v) for v, srcs in found.items() for u in srcs if isinstance(u, int)}
    only_eager, only_export = sorted(eager - exported), sorted(exported - eager)
    if only_eager or only_export:
        def text(edges: list[tuple[int, int]]) -> str:
            return ", ".join(f"{names[u]}->{names[v]}" for u, v in edges) or "none"
        warnings.append(f"the traces disagree: only eager found {text(only_eager)}; "
                        f"only export found {text(only_export)}")
