"""``pipeplan export --to torch``: a folder that trains the plan with torch.distributed.pipelining.

Three files: ``schedule.csv`` (every pipeline rank's actions in torch's compute-only
CSV format, the one ``_PipelineScheduleRuntime._load_csv`` reads), ``stages.json``
(each rank's stages, the units / module names each stage holds, the tensors crossing
its cuts, its data-parallel group, and the model with everything that built it) and
``train.py`` (:mod:`pipeplan.runtime.export.torch_train`); for a model named by
``path/to/file.py:factory``, a copy of that file too, which ``train.py`` loads.

Pipeline rank ``g`` is the plan's device group ``g`` (spec 7.2) and holds every stage of
that group: one stage in a version-1 plan, several under the version-2 schedules,
which run as torch's own classes (``ScheduleInterleaved1F1B`` ...) and custom programs
as the CSV.  A version-3 plan's ``tensor_parallel`` (one degree for all stages) makes the
device mesh ``pp x dp x tp``: ``train.py`` splits each stage's units over ``tp`` with
``parallelize_module`` (the plan :func:`pipeplan.runtime.sharding.tensor_parallel_plan`
gives, as ``pipeplan run`` does) and steps the parameters of stages with ``zero`` 1 or 2
with ``ZeroRedundancyOptimizer`` over ``dp``.

An imported model (any spec but a zoo name) is built and cut as ``pipeplan run``
builds it, before anything is written: what ``run`` refuses (an example of several
tensors, a unit output holding integers, a graph profiled from another model) the
export refuses with the same message.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.export import torch_train
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.schedule import programs_to_csv

EXPORT_FORMAT = "pipeplan.torch-export/2"

TORCH_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
                 "interleaved-zb": "ScheduleInterleavedZeroBubble", "looped-bfs": "ScheduleLoopedBFS",
                 "zbv": "ScheduleZBVZeroBubble"}
"""The torch 2.13 class of each named plan schedule (the programs of spec 7.2 are theirs): the target's names
for its own classes, kept here with the exporter rather than on our schedule classes."""


def crossing(graph: LayerGraph, cut_after: int) -> list[int]:
    """Layers ``u <= cut_after`` whose output a layer after the cut consumes (relayed ones too).

    Examples
    --------
    >>> from pipeplan.models.synthetic import synthetic_graph
    >>> crossing(synthetic_graph(4, 0), 1)
    [1]
    """
    return sorted({u for u, v in graph.edges if u <= cut_after < v})


def torch_schedule(plan: Plan) -> str:
    """The torch schedule class that runs the plan's programs, or ``"csv"``.

    ``Schedule1F1B`` needs at least as many microbatches as stages; with fewer, the
    plan's own 1F1B op lists go through the CSV.  Custom plans always do.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> torch_schedule(Plan("g", "c", 2, 4.0, "zbv", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("a",), (1, 1)))))
    'ScheduleZBVZeroBubble'
    """
    m = len(plan.stages[0].microbatches)
    # torch's Schedule1F1B (its own class, keyed by our name in TORCH_CLASSES) refuses fewer microbatches than stages
    if plan.schedule_class.from_plan or (plan.schedule == "1f1b" and m < len(plan.stages)):
        return "csv"
    return TORCH_CLASSES[plan.schedule]


def schedule_csv(plan: Plan) -> str:
    """One row per pipeline rank (device group), one ``<stage><F|B|I|W><microbatch>`` action per cell.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> p = Plan("g", "c", 2, 4.0, "gpipe", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("b",), (1, 1))))
    >>> schedule_csv(p)
    '0F0,0F1,0B0,0B1\\r\\n1F0,1F1,1B0,1B1\\r\\n'
    """
    return programs_to_csv(plan.actions())


def stages_config(plan: Plan, graph: LayerGraph, model: str | ModelRequest) -> dict:
    """The ``stages.json`` object ``train.py`` reads.

    Rank ``g * r + j`` is replica ``j`` of device group ``g`` (``r`` replicas per
    group) and runs every stage of that group.  ``model`` is the spec ``train.py``
    builds by default; ``model_options`` the options that go with it (``--model-arg``,
    ``--input-shape/-dtype/-high``, ``--units``).
    """
    request = model if isinstance(model, ModelRequest) else ModelRequest(model)
    names = [layer.name for layer in graph.layers]
    stage_of_unit = [s for s, st in enumerate(plan.stages) for _ in range(*st.layers)]
    r = plan.stages[0].replicas
    t = plan.stages[0].tensor_parallel
    n = r * t  # processes per device group: rank g * n + j * t + i is tensor-parallel rank i of replica j
    group_of_stage = plan.stage_groups
    profile = graph.extra.get("profile") if isinstance(graph.extra.get("profile"), dict) else {}
    seq_len = (profile.get("config") or {}).get("seq_len")
    stages = []
    for s, st in enumerate(plan.stages):
        lo, hi = st.layers
        g = group_of_stage[s]
        stages.append({"index": s, "layers": [lo, hi], "units": names[lo:hi],
                       "inputs": crossing(graph, lo - 1) if s > 0 else [-1],
                       "outputs": crossing(graph, hi - 1) if s < len(plan.stages) - 1 else [hi - 1],
                       "recompute": st.recompute, "group": g, "ranks": [g * n + k for k in range(n)],
                       "devices": list(st.devices), "zero": plan.stage_zero(s)})
    groups = [{"index": g, "stages": [s for s, h in enumerate(group_of_stage) if h == g],
               "ranks": [g * n + k for k in range(n)], "devices": list(devices)}
              for g, devices in enumerate(plan.groups)]
    mesh = {"shape": [len(groups), r], "dims": ["pp", "dp"]} if t == 1 else \
        {"shape": [len(groups), r, t], "dims": ["pp", "dp", "tp"]}
    options = {key: value for key, value in request.to_dict().items() if key != "spec"}
    return {"format": EXPORT_FORMAT, "graph": graph.name, "model": request.spec, "model_options": options,
            "seq_len": seq_len if isinstance(seq_len, int) else None,
            "plan_schedule": plan.schedule, "torch_schedule": torch_schedule(plan), "schedule_csv": "schedule.csv",
            "global_batch": plan.global_batch, "microbatches": len(plan.stages[0].microbatches),
            "microbatch_size": plan.stages[0].microbatches[0], "replicas": r, "tensor_parallel": t,
            "mesh": mesh,
            "ranks": [{"rank": g * n + k, "group": g, "stages": group["stages"], "replica": k // t, "device": dev,
                       **({"tp_rank": k % t} if t > 1 else {})}
                      for g, group in enumerate(groups) for k, dev in enumerate(group["devices"])],
            "groups": groups, "stages": stages, "stage_of_unit": stage_of_unit, "group_of_stage": group_of_stage,
            "tied": [[i, layer.tied_to] for i, layer in enumerate(graph.layers) if layer.tied_to is not None]}


def export_torch(plan: Plan, graph: LayerGraph, model: str | ModelRequest | None = None,
                 graph_file: str = "-") -> dict[str, str]:
    """``{relative path: text}`` of the torch folder for a plan the target runs
    (see :func:`pipeplan.runtime.export.rules.check_plan`).

    Parameters
    ----------
    plan : Plan
        A plan with one microbatch split and one replica count for all stages.
    graph : LayerGraph
        Its graph (unit names, crossing tensors, ties).
    model : str or ModelRequest, optional
        The model ``train.py`` builds by default (:func:`export_request`: ``None``, the
        model the graph was profiled from, with its options).
    graph_file : str
        The graph's path, for messages.

    Returns
    -------
    dict
        ``schedule.csv``, ``stages.json``, ``train.py`` and, for a factory file, its copy.

    Raises
    ------
    InputError
        A model that ``pipeplan run`` would refuse, with its message; a factory file
        that cannot be read.
    """
    request = model if isinstance(model, ModelRequest) else export_request(graph, model)
    check_degrees(plan)
    files: dict[str, str] = {}
    if not request.is_zoo:
        check_runnable(request, graph, graph_file)
        request, files = _copied_factory(request)
    return {"schedule.csv": schedule_csv(plan),
            "stages.json": json.dumps(stages_config(plan, graph, request), indent=2) + "\n",
            "train.py": inspect.getsource(torch_train), **files}


def check_degrees(plan: Plan, file: str = "-") -> None:
    """Refuse stages of different ``tensor_parallel``: ``train.py``'s device mesh is ``pp x dp x tp``.

    torch.distributed.pipelining sends a stage's outputs from each rank to the rank at the
    same mesh coordinates of the next stage, so every stage has the same replicas and degree.

    Raises
    ------
    InputError
        Naming the first stage whose degree differs from stage 0's.
    """
    degrees = [st.tensor_parallel for st in plan.stages]
    for s, t in enumerate(degrees):
        if t != degrees[0]:
            raise InputError(file, f"stages[{s}].tensor_parallel",
                             f"stage {s} has tensor_parallel {t} but stage 0 has {degrees[0]}; the torch export "
                             "builds one pp x dp x tp device mesh, so every stage needs the same degree")


def export_request(graph: LayerGraph, model: str | None) -> ModelRequest:
    """The model ``train.py`` builds: ``model`` (``--model``), or the one the graph was profiled from.

    The graph's ``profile.request`` (written by ``pipeplan profile``) carries the
    options that built the model; they apply when ``model`` is not given or names the
    same model.  Without it, the graph's ``profile.model`` or, last, its name.

    Examples
    --------
    >>> from pipeplan.models.graph import load_graph
    >>> export_request(load_graph("examples/gpt-tiny.graph.json"), None).spec
    'gpt-tiny'
    """
    profile = graph.extra.get("profile") if isinstance(graph.extra.get("profile"), dict) else {}
    profiled = ModelRequest.from_dict(profile["request"]) if "request" in profile else None
    named = profile.get("model") if isinstance(profile.get("model"), str) else None
    if model is None:
        return profiled or ModelRequest(named or graph.name)
    given = ModelRequest(model).absolute()
    if profiled is not None and given.spec in (profiled.spec, named):
        return profiled
    return given


def check_runnable(request: ModelRequest, graph: LayerGraph, graph_file: str = "-") -> None:
    """Build and cut the model as ``pipeplan run`` does and match it to the graph; its refusals as theirs."""
    from pipeplan.runtime.checks import check_model_matches
    from pipeplan.runtime.training_data import build_run_model

    check_model_matches(build_run_model(request), graph, graph_file)


RESERVED = ("schedule.csv", "stages.json", "train.py")
"""Names of the folder's own files, which a copied factory file must not take."""


def _copied_factory(request: ModelRequest) -> tuple[ModelRequest, dict[str, str]]:
    """A factory file copied beside ``train.py``: the request naming the copy, and the copy."""
    target = request.factory_file
    if target is None:
        return request, {}
    path = Path(target)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(target, "file", f"the model's factory file cannot be read ({exc}); name the model with "
                                         "--model path/to/file.py:factory") from None
    name = path.name if path.name not in RESERVED else f"model_{path.name}"
    attr = request.spec.rpartition(":")[2]
    return ModelRequest(f"{name}:{attr}", request.model_args, request.input_shape, request.input_dtype,
                        request.input_high, request.units), {name: text}
