"""``pipeplan export --to torchtitan``: the plan as torchtitan's own config, for its current and its previous release.

torchtitan 0.3 (``torchtitan/config/manager.py``) reads no TOML file: ``torchtitan.train``
takes ``--module M --config F`` and calls the function ``F`` of the Python module ``M``
(``M.config_registry`` first), which returns a ``Trainer.Config``.  The export for 0.3 is
``pipeplan_torchtitan.py``, such a module: its ``pipeplan_plan()`` takes a config of
torchtitan's registry (by default ``llama3_debugmodel``), sets the plan's
``ParallelismConfig`` and ``TrainingConfig`` fields and the activation-checkpoint policy
(``FullAC.Config()`` or ``None``), and checks the plan's module names against the model
it builds.  Its decoders name the output projection ``lm_head``.

torchtitan 0.2 reads ``--job.config_file torchtitan.toml`` (``[parallelism]``,
``[training]``, ``[activation_checkpoint] mode``, ``[model] name / flavor``); its
decoders name the output projection ``output``.

Fields of both: ``pipeline_parallel_degree`` (the plan's device groups),
``pipeline_parallel_schedule`` (``GPipe``, ``1F1B``, ``Interleaved1F1B``,
``InterleavedZeroBubble``, ``LoopedBFS``, ``ZBVZeroBubble``) or
``pipeline_parallel_schedule_csv``, ``module_fqns_per_model_part`` (one model part per
stage), ``data_parallel_replicate_degree`` and ``data_parallel_shard_degree`` (DDP for ZeRO 0,
FSDP for ZeRO 1: :func:`data_parallel`), ``tensor_parallel_degree`` (a plan's one degree
above 1), ``pipeline_parallel_microbatch_size`` and ``local_batch_size``.

torchtitan's split (``_split_module`` in ``torchtitan/distributed/pipeline_parallel.py``)
keeps in each part the modules named and sets every other top-level module to ``None``
and deletes every other ``layers`` entry, without a word: a name that is not a module of
the model, or a module no part names, silently drops a layer (a last stage without its
``lm_head`` returns hidden states instead of logits).  So every name is checked against
the chosen model: at export when that torchtitan release is installed, and by
``pipeplan_plan()`` itself when torchtitan loads it.

torchtitan places the model parts itself (``_get_pp_rank_to_stage_indices_mapping``):
part ``s`` on rank ``s mod pp`` (``loop`` style), or in V pairs ``(g, 2pp-1-g)`` when the
schedule is ``ZBVZeroBubble`` or ``DualPipeV``, every rank the same number of parts.
With a CSV the schedule name still chooses that style, so custom programs whose groups
hold several stages name ``Interleaved1F1B`` (loop) or ``ZBVZeroBubble`` (V) as well;
other placements are refused, and so is a plan on one device group:
``pipeline_parallel_degree = 1`` runs no pipeline at all (``ParallelDims.pp_enabled`` is
false), so the plan's stages and microbatches would be ignored.
``pipeline_parallel_layers_per_stage`` is not written: it only generates an even split
when ``module_fqns_per_model_part`` is absent.

Tied weights: torchtitan refuses a model with ``enable_weight_tying`` under pipeline
parallelism (``Decoder.Config.update_from_config``: "Weight tying is not supported with
Pipeline Parallel"), so a graph whose head is tied to its embedding (GPT) is trained by
torchtitan with an untied ``lm_head``; the export says so in the file it writes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.layer_roles import block_index, transformer_roles
from pipeplan.runtime.export.rules import placement
from pipeplan.runtime.export.torch_target import schedule_csv
from pipeplan.solver.formats.plan import Plan

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                  "interleaved-zb": "InterleavedZeroBubble", "looped-bfs": "LoopedBFS", "zbv": "ZBVZeroBubble"}
"""torchtitan's names (torch's ``get_schedule_class``) of the plan schedules it runs by name: the target's own
table, so it stays keyed by our names rather than being an attribute of our schedule classes."""

CSV_PLACEMENT_NAMES = {"loop": "Interleaved1F1B", "v": "ZBVZeroBubble"}
"""The schedule name that makes torchtitan place a CSV's stages as the plan does (``loop`` or ``v`` style)."""


@dataclass(frozen=True)
class Release:
    """What differs between the torchtitan releases the export writes for."""

    version: str
    """``major.minor``."""
    head: str
    """The decoders' output projection module."""
    model: str
    """The default model: ``MODULE:CONFIG`` of a config registry (0.3), ``NAME:FLAVOR`` (0.2)."""
    config_file: str
    """The file written."""


RELEASES = {"0.3": Release("0.3", "lm_head", "llama3:llama3_debugmodel", "pipeplan_torchtitan.py"),
            "0.2": Release("0.2", "output", "llama3:debugmodel", "torchtitan.toml")}
"""The torchtitan releases the export writes for, by ``major.minor``; the first is the current one."""

CURRENT = "0.3"


def installed_version() -> str | None:
    """``major.minor`` of the installed torchtitan, or ``None``."""
    try:
        version = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None
    return ".".join(version.split(".")[:2])


def choose_release(requested: str | None, file: str = "-") -> Release:
    """The release named (``0.3``, ``0.3.1``, ``0.2``), else the installed one, else the current one.

    Raises
    ------
    InputError
        For a release the export does not write for (named, or installed with none named).

    Examples
    --------
    >>> choose_release("0.2.2").head
    'output'
    """
    if requested is not None:
        key = ".".join(requested.split(".")[:2])
        if key not in RELEASES:
            raise InputError(file, "--torchtitan-version", f"torchtitan {requested} is not one the export writes "
                                                           f"for: {', '.join(RELEASES)}")
        return RELEASES[key]
    installed = installed_version()
    if installed is None:
        return RELEASES[CURRENT]
    if installed not in RELEASES:
        raise InputError(file, "--torchtitan-version", f"torchtitan {installed} is installed, and the export writes "
                                                       f"for {', '.join(RELEASES)}: name one with "
                                                       f"--torchtitan-version")
    return RELEASES[installed]


def csv_schedule_name(plan: Plan, file: str = "-") -> str | None:
    """The ``pipeline_parallel_schedule`` a custom plan's CSV needs for torchtitan to place its stages
    (``None``: one stage per rank, the default ``1F1B`` places them).

    Raises
    ------
    InputError
        If the groups hold their stages in neither torchtitan style.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> def custom(*devices):
    ...     return Plan("g", "c", 1, 4.0, "custom", tuple(Stage((i, i + 1), d, (1,)) for i, d in enumerate(devices)))
    >>> csv_schedule_name(custom(("a",), ("b",), ("b",), ("a",)))
    'ZBVZeroBubble'
    """
    style = placement(plan)
    if style == "one":
        return None
    if style in CSV_PLACEMENT_NAMES:
        return CSV_PLACEMENT_NAMES[style]
    where = next((s for s, g in enumerate(plan.stage_groups) if g != s % len(plan.groups)), len(plan.stages) - 1)
    raise InputError(file, f"stages[{where}].devices",
                     f"stage {where} is on device group {plan.stage_groups[where]}: torchtitan places model part s "
                     f"on rank s mod pp, or in V pairs (g, 2pp-1-g), every rank the same number of parts "
                     f"(_get_pp_rank_to_stage_indices_mapping); put stage s on group s mod "
                     f"{len(plan.groups)} or in the V, or export with --to torch, which runs any placement")


def module_fqns(plan: Plan, graph: LayerGraph, file: str = "-", release: Release = RELEASES[CURRENT]
                ) -> list[list[str]]:
    """torchtitan's module names of every stage's layers.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer
    >>> from pipeplan.solver.formats.plan import Stage
    >>> g = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in ("embed", "block.0", "head")])
    >>> p = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 2), ("a",), (2,)), Stage((2, 3), ("b",), (2,))))
    >>> module_fqns(p, g)
    [['tok_embeddings', 'layers.0'], ['norm', 'lm_head']]
    >>> module_fqns(p, g, release=RELEASES["0.2"])[1]
    ['norm', 'output']
    """
    roles = transformer_roles(graph, file, "torchtitan")
    names = {"E": lambda i: ["tok_embeddings"], "L": lambda i: ["norm", release.head],
             "t": lambda i: [f"layers.{block_index(graph.layers[i].name)}"]}
    return [[fqn for i in range(*st.layers) for fqn in names[roles[i]](i)] for st in plan.stages]


def check_module_names(parts: list[list[str]], modules: list[str], model: str, file: str = "-") -> None:
    """Every name of ``parts`` a module of the model, every module of the model in exactly one part.

    ``modules``: what torchtitan's split can keep (the model's top-level modules and its
    ``layers.N``).

    Raises
    ------
    InputError
        Naming the module and the part: torchtitan's split would silently drop it.

    Examples
    --------
    >>> check_module_names([["tok_embeddings", "layers.0"], ["norm", "output"]],
    ...                    ["tok_embeddings", "layers.0", "norm", "lm_head"], "llama3")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeplan.models.errors.InputError: -: stages[1]: stage 1 names 'output', which is no module of ...
    """
    for s, part in enumerate(parts):
        for name in part:
            if name not in modules:
                raise InputError(file, f"stages[{s}]", f"stage {s} names {name!r}, which is no module of torchtitan's "
                                                       f"{model} (its modules: {', '.join(modules)}): torchtitan's "
                                                       f"split would silently leave it out of every stage; export "
                                                       f"for the torchtitan release and model that will run the "
                                                       f"plan (--torchtitan-version, --torchtitan-model)")
    named = [name for part in parts for name in part]
    for name in modules:
        if named.count(name) != 1:
            where = "no stage" if name not in named else f"{named.count(name)} stages"
            raise InputError(file, "stages", f"torchtitan's {model} has module {name!r}, which {where} of the plan "
                                             f"holds: torchtitan's split keeps in each stage only the modules it "
                                             f"names, so it would be silently {'dropped' if name not in named else 'repeated'}; "
                                             f"export a graph with one layer per module of the model "
                                             f"({len(modules)} modules: {', '.join(modules)})")


def model_modules(release: Release, model: str) -> list[str] | None:
    """The module names torchtitan's split can keep in ``model`` of ``release`` (built on the meta
    device), or ``None`` when that release of torchtitan is not installed."""
    if installed_version() != release.version:
        return None
    import torch

    with _root_warnings_off():
        if release.version == "0.3":
            module, _, function = model.partition(":")
            config = getattr(config_registry(module), function)().model_spec.model
            with torch.device("meta"):
                built = config.build()
        else:
            name, _, flavor = model.partition(":")
            spec = importlib.import_module("torchtitan.protocols.train_spec").get_train_spec(name)
            with torch.device("meta"):
                built = spec.model_cls(spec.model_args[flavor])
    return split_names(built)


@contextmanager
def _root_warnings_off() -> Iterator[None]:
    """The root logger at ``ERROR`` for the block.  torchtitan logs to the root logger, and building
    a trainer config only to read its module names makes it advise on checkpoints the user never
    asked for (``initial_load_model_only=True has no effect ...``) on every export."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def config_registry(module: str):
    """torchtitan 0.3's ``--module``: a model of ``torchtitan.models`` (or its experiments) by
    name, else a module path (``M.config_registry`` first, then ``M``), as its ``ConfigManager``
    resolves it."""
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    if module in _supported_models | _supported_experiments:
        prefix = "torchtitan.models" if module in _supported_models else "torchtitan.experiments"
        return importlib.import_module(f"{prefix}.{module}.config_registry")
    try:
        return importlib.import_module(f"{module}.config_registry")
    except ImportError:
        return importlib.import_module(module)


def split_names(model) -> list[str]:
    """The names torchtitan's ``_split_module`` keeps or drops: each top-level module, and the
    entries of a top-level ``ModuleDict`` / ``ModuleList`` as ``name.key``."""
    from torch import nn

    names = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleDict, nn.ModuleList)):
            names += [f"{name}.{key}" for key, _ in child.named_children()]
        elif child is not None:
            names.append(name)
    return names


def _header(plan: Plan, graph: LayerGraph, release: Release) -> list[str]:
    st = plan.stages[0]
    groups, t = len(plan.groups), st.tensor_parallel
    replicas = f"{st.replicas} {'replica' if st.replicas == 1 else 'replicas'}"
    tp = f" x tensor-parallel degree {t}" if t > 1 else ""
    lines = [f"torchtitan {release.version} config for plan on graph {json.dumps(graph.name)}: {len(plan.stages)} "
             f"stages on {groups} pipeline ranks x {replicas}{tp} = {groups * st.replicas * t} processes"]
    if t > 1 and release.version == "0.2":
        lines.append("Tensor parallelism: torchtitan 0.2 always adds sequence parallelism to it (SequenceParallel "
                     "norms): the same bytes move as the plan's all-reduces, and the norms' activations are split.")
    if plan.stage_zero(0) == 1:
        lines.append("ZeRO-1: FSDP (data_parallel_shard_degree) under pipeline parallelism keeps whole weights and "
                     "gradients through the step and reduce-scatters the gradients once after the last "
                     "microbatch; the optimizer state is sharded.")
    tied = [layer.name for layer in graph.layers if layer.tied_to is not None]
    if tied:
        lines.append(f"Tied weights: the graph's {', '.join(tied)} shares its embedding's weights; torchtitan refuses "
                     f"enable_weight_tying under pipeline parallelism, so its {release.head} is a weight of its own.")
    return lines


def parallelism(plan: Plan, graph: LayerGraph, file: str, plan_file: str, release: Release) -> dict:
    """The ``[parallelism]`` fields (schedule, parts, microbatch size, data-parallel degrees)."""
    st = plan.stages[0]
    fields: dict = {"pipeline_parallel_degree": len(plan.groups)}
    name = SCHEDULE_NAMES.get(plan.schedule) or csv_schedule_name(plan, plan_file)
    if name is not None:
        fields["pipeline_parallel_schedule"] = name
    if plan.schedule not in SCHEDULE_NAMES:
        fields["pipeline_parallel_schedule_csv"] = "schedule.csv"
    fields.update({"module_fqns_per_model_part": module_fqns(plan, graph, file, release),
                   "pipeline_parallel_microbatch_size": st.microbatches[0] // st.replicas})
    fields.update(data_parallel(plan, release))
    return fields


def data_parallel(plan: Plan, release: Release) -> dict:
    """The data- and tensor-parallel ``[parallelism]`` fields (the target checked one degree and one ZeRO level).

    ZeRO 0 is DDP (``data_parallel_replicate_degree``); ZeRO 1 is FSDP
    (``data_parallel_shard_degree``, ``fsdp_reshard_after_forward = "never"``: one
    all-gather of the weights per step, which under pipeline parallelism also keeps the
    gradients whole until the last microbatch's backward, as torch's ``PipelineStage``
    runs FSDP).  A degree above 1 is ``tensor_parallel_degree``; on 0.3, with
    ``enable_sequence_parallel = false``, so that it runs the plan's all-reduces
    (docs/model.md section 8).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> p = Plan("g", "c", 8, 4.0, "1f1b", (Stage((0, 1), ("a", "b", "c", "d"), (8,), tensor_parallel=2),), zero=1)
    >>> data_parallel(p, RELEASES["0.3"])  # doctest: +NORMALIZE_WHITESPACE
    {'data_parallel_replicate_degree': 1, 'data_parallel_shard_degree': 2, 'fsdp_reshard_after_forward': 'never',
     'tensor_parallel_degree': 2, 'enable_sequence_parallel': False}
    """
    st = plan.stages[0]
    if plan.stage_zero(0) == 1:
        fields: dict = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": st.replicas,
                        "fsdp_reshard_after_forward": "never"}
    else:
        fields = {"data_parallel_replicate_degree": st.replicas, "data_parallel_shard_degree": 1}
    if st.tensor_parallel > 1:
        fields["tensor_parallel_degree"] = st.tensor_parallel
        if release.version != "0.2":  # 0.2 has no such key: it always adds sequence parallelism
            fields["enable_sequence_parallel"] = False
    return fields


def toml_fragment(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-",
                  release: Release = RELEASES["0.2"], model: str | None = None) -> str:
    """torchtitan 0.2's TOML (JSON strings and arrays are valid TOML values); ``file`` and
    ``plan_file`` name the graph and the plan in errors."""
    st = plan.stages[0]
    name, _, flavor = (model or release.model).partition(":")
    lines = [f"# {line}" for line in _header(plan, graph, release)]
    lines += ["[model]", f"name = {json.dumps(name)}", f"flavor = {json.dumps(flavor)}", "", "[parallelism]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in parallelism(plan, graph, file, plan_file, release).items()]
    lines += ["", "[training]", f"local_batch_size = {plan.global_batch // st.replicas}",
              f"global_batch_size = {plan.global_batch}", "",
              "[activation_checkpoint]", f"mode = {json.dumps('full' if st.recompute else 'none')}"]
    return "\n".join(lines) + "\n"


_MODULE = '''"""{header}

Written by ``pipeplan export --to torchtitan``.  Run from this folder, one process per device:

    torchrun --nproc-per-node={world} -m torchtitan.train --module pipeplan_torchtitan --config pipeplan_plan

``pipeplan_plan()`` starts from torchtitan's ``{base}`` config (``BASE``; the model, data,
optimizer and steps are its) and sets the plan's pipeline: the parts (one per stage), the
schedule, the microbatch size, the data-parallel degrees, the batch and the
activation-checkpoint policy, and turns CUDA graphs off (torchtitan 0.3 refuses them under
pipeline parallelism).  Before it returns it checks that every name of
``MODULE_FQNS_PER_MODEL_PART`` is a module of that model and every module of the model is
in one part: torchtitan's split would silently drop any other.
"""

import importlib
from pathlib import Path

import torch

BASE = {base!r}
"""``MODULE:FUNCTION`` of the config the plan is set on (MODULE as torchtitan's ``--module``:
a model of torchtitan by name, or a module path)."""

PARALLELISM = {parallelism}
"""The ``ParallelismConfig`` fields of the plan."""

MODULE_FQNS_PER_MODEL_PART = PARALLELISM["module_fqns_per_model_part"]
"""Model part s (stage s of the plan): the modules torchtitan keeps in it."""

LOCAL_BATCH_SIZE = {local_batch}
"""Samples per data-parallel replica and step, split into microbatches of ``pipeline_parallel_microbatch_size``."""

GLOBAL_BATCH_SIZE = {global_batch}
"""The plan's batch."""

RECOMPUTE = {recompute}
"""Whether the stages recompute: torchtitan's ``FullAC`` (every block), else no activation checkpointing."""


def base_config():
    """The config ``BASE`` names, its module resolved as torchtitan's ``--module`` is."""
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    module, _, function = BASE.partition(":")
    if module in _supported_models | _supported_experiments:
        prefix = "torchtitan.models" if module in _supported_models else "torchtitan.experiments"
        registry = importlib.import_module(f"{{prefix}}.{{module}}.config_registry")
    else:
        try:
            registry = importlib.import_module(f"{{module}}.config_registry")
        except ImportError:
            registry = importlib.import_module(module)
    return getattr(registry, function)()


def split_names(model):
    """What torchtitan's ``_split_module`` keeps or drops: top-level modules, and ``name.key``
    for the entries of a top-level ``ModuleDict`` / ``ModuleList``."""
    names = []
    for name, child in model.named_children():
        if isinstance(child, (torch.nn.ModuleDict, torch.nn.ModuleList)):
            names += [f"{{name}}.{{key}}" for key, _ in child.named_children()]
        elif child is not None:
            names.append(name)
    return names


def check_parts(config):
    """Raise ``ValueError`` unless the parts name every module of the model exactly once, and nothing else."""
    with torch.device("meta"):
        modules = split_names(config.model_spec.model.build())
    named = [name for part in MODULE_FQNS_PER_MODEL_PART for name in part]
    unknown = sorted(set(named) - set(modules))
    missing = [name for name in modules if named.count(name) != 1]
    if unknown or missing:
        raise ValueError(f"{{Path(__file__).name}}: MODULE_FQNS_PER_MODEL_PART: the plan's parts name {{unknown}}, "
                         f"which are no modules of {{BASE}}, and leave out or repeat {{missing}}: torchtitan's split "
                         f"would silently drop them; export the plan for this model (its modules: {{modules}})")


def pipeplan_plan():
    """torchtitan's ``BASE`` config with the plan's pipeline."""
    from torchtitan.distributed.activation_checkpoint import FullAC

    config = base_config()
    for key, value in PARALLELISM.items():
        setattr(config.parallelism, key, value)
    if config.parallelism.pipeline_parallel_schedule_csv:
        config.parallelism.pipeline_parallel_schedule_csv = str(Path(__file__).with_name("schedule.csv"))
    config.training.local_batch_size = LOCAL_BATCH_SIZE
    config.training.global_batch_size = GLOBAL_BATCH_SIZE
    config.training.disable_cuda_graphs = True  # torchtitan captures none under pipeline parallelism
    config.activation_checkpoint = FullAC.Config() if RECOMPUTE else None
    check_parts(config)
    return config
'''


def config_module(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-",
                  release: Release = RELEASES["0.3"], model: str | None = None) -> str:
    """torchtitan 0.3's config module ``pipeplan_torchtitan.py`` (see the module docs)."""
    st = plan.stages[0]
    fields = parallelism(plan, graph, file, plan_file, release)
    entries = [f"    {json.dumps(key)}: {_python_literal(value)}" for key, value in fields.items()]
    body = "{\n" + ",\n".join(entries) + ",\n}"
    return _MODULE.format(header="\n".join(_header(plan, graph, release)),
                          world=len(plan.groups) * st.replicas * st.tensor_parallel,
                          base=model or release.model, parallelism=body, local_batch=plan.global_batch // st.replicas,
                          global_batch=plan.global_batch, recompute=st.recompute)


def _python_literal(value: object) -> str:
    """``value`` (a string, number, boolean or list of them) as Python source: JSON's, but ``True``/``False``."""
    return repr(value) if isinstance(value, bool) else json.dumps(value)


def check_runs_a_pipeline(plan: Plan, file: str = "-") -> None:
    """Refuse a plan on one device group: torchtitan with ``pipeline_parallel_degree = 1`` runs no pipeline.

    Raises
    ------
    InputError
        If the plan has one device group and more than one stage or microbatch.
    """
    m = len(plan.stages[0].microbatches)
    if len(plan.groups) == 1 and (len(plan.stages) > 1 or m > 1):
        raise InputError(file, "stages", f"{len(plan.stages)} stages and {m} microbatches on 1 device group: "
                                         f"torchtitan takes pipeline_parallel_degree = 1 as no pipeline "
                                         f"(ParallelDims.pp_enabled is false) and would silently run the whole "
                                         f"model on one batch, ignoring the plan's stages and microbatches; plan "
                                         f"for 2 or more device groups, or export with --to torch")


def export_torchtitan(plan: Plan, graph: LayerGraph, file: str = "-", plan_file: str = "-",
                      release: Release | None = None, model: str | None = None) -> dict[str, str]:
    """The config file of ``release`` (the installed or current one by default), plus ``schedule.csv``
    for a custom op list.

    ``model`` is torchtitan's model (``MODULE:CONFIG`` for 0.3, ``NAME:FLAVOR`` for 0.2; the
    release's debug model by default); when that release is installed, the plan's module
    names are checked against it here.
    """
    release = release or choose_release(None, plan_file)
    check_runs_a_pipeline(plan, plan_file)
    parts = parallelism(plan, graph, file, plan_file, release)["module_fqns_per_model_part"]  # placement checked
    chosen = model or release.model
    modules = model_modules(release, chosen)
    if modules is not None:
        check_module_names(parts, modules, chosen, plan_file)
    if release.version == "0.3":
        files = {release.config_file: config_module(plan, graph, file, plan_file, release, chosen)}
    else:
        files = {release.config_file: toml_fragment(plan, graph, file, plan_file, release, chosen)}
    if plan.schedule not in SCHEDULE_NAMES:
        files["schedule.csv"] = schedule_csv(plan)
    return files
