"""``pipeplan models`` lists the model zoo; ``pipeplan profile`` turns a model into a layer graph.

``profile`` measures the model on this machine (timings fitted to ``a + b*n``), or
with ``--analytic`` estimates it from FLOPs for a device of given speed without
allocating any weights.  The graph is written atomically as ``pipeplan.graph/2``: besides
forward and backward times it carries each layer's weight-gradient part of the backward
(``bwd_w``), the bytes the weight gradient still needs (``act_w``) and the optimizer
step (``step``, for ``--optimizer``).  Layers with a known tensor-parallel plan
(transformer blocks, token embeddings, language-model heads) also carry ``tp_share`` and
``tp_comm`` (a ``pipeplan.graph/3`` file) unless ``--no-tensor-parallel`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from pipeplan.models.model_options import SPEC_HELP, add_model_options, imported_from_args, zoo_only_options
from pipeplan.models.errors import InputError, one_line
from pipeplan.models.jsonio import atomic_write_text, check_integer, dumps
from pipeplan.outputs import add_force_option, check_outputs
from pipeplan.models.zoo import build_model, model_names

if TYPE_CHECKING:  # torch is imported where a model is built or profiled, not while the parser is built
    import torch

DTYPES = ("float32", "bfloat16")
"""``--dtype`` choices: names of torch dtypes."""

OPTIMIZER_NAMES = ("adam", "sgd")
"""``--optimizer`` choices, as :data:`pipeplan.models.profile_step.OPTIMIZERS` names them (that module imports
torch; a test holds the two equal)."""


def register(subparsers: Any) -> None:
    """Add the ``models`` and ``profile`` sub-commands."""
    models = subparsers.add_parser("models", help="list the model zoo",
                                   description="List the zoo: name, units, unique parameters.")
    models.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    models.set_defaults(func=run_models)

    profile = subparsers.add_parser("profile", help="profile a model into a layer graph",
                                    description="Measure (or with --analytic estimate) a zoo model or your own "
                                                "PyTorch model and write its pipeplan.graph/2 file (/3 when "
                                                "layers have a known tensor-parallel plan).")
    profile.add_argument("model", help=f"{SPEC_HELP} (zoo: {', '.join(model_names())})")
    profile.add_argument("-o", "--output", metavar="GRAPH.json", help="graph file to write (required unless --dry-run)")
    add_force_option(profile)
    profile.add_argument("--dry-run", action="store_true",
                         help="print the units, edges, ties and warnings; time nothing, write nothing")
    add_model_options(profile)
    profile.add_argument("--batch-sizes", default=None, metavar="N,N,...",
                         help="microbatch sizes to time (default 1,2,4,8; measuring only, not with --analytic)")
    profile.add_argument("--analytic", action="store_true",
                         help="estimate from FLOPs on the meta device instead of measuring")
    profile.add_argument("--flops", metavar="F", help="peak FLOP/s of the device (--analytic; default 312e12)")
    profile.add_argument("--efficiency", metavar="E", help="fraction of peak achieved (--analytic; default 0.4)")
    profile.add_argument("--overhead", metavar="S", help="seconds per unit call (--analytic; default 2e-5)")
    profile.add_argument("--bandwidth", metavar="B",
                         help="memory bytes/s bounding the optimizer step (--analytic; default 2e12)")
    profile.add_argument("--optimizer", default="adam", metavar="|".join(OPTIMIZER_NAMES),
                         help="optimizer whose step each layer's step field times or estimates (default adam)")
    profile.add_argument("--dtype", default="float32", help="float32 or bfloat16 (default float32)")
    profile.add_argument("--seq-len", metavar="N", help="tokens per sample of sequence models")
    profile.add_argument("--threads", default=None, metavar="N",
                         help="torch threads while measuring (default 1; measuring only)")
    profile.add_argument("--rounds", default=None, metavar="N",
                         help="passes over every unit and batch size, each timing --repeats runs; the median is "
                              "over all (default 1; more spread the samples over time on a shared machine; "
                              "measuring only)")
    profile.add_argument("--warmup", default=None, metavar="N", help="untimed runs per op (default 2; measuring only)")
    profile.add_argument("--repeats", default=None, metavar="N",
                         help="timed runs per op, median kept (default 5; measuring only)")
    profile.add_argument("--device", default=None, metavar="cpu|cuda[:N]",
                         help="where to measure (default cpu; measuring only): a graph for this GPU's kind")
    profile.add_argument("--no-tensor-parallel", action="store_true",
                         help="write no tp_share/tp_comm: the graph of a model none of whose layers tensor "
                              "parallelism splits (by default transformer blocks, token embeddings and LM heads "
                              "get them)")
    profile.add_argument("--no-cache", action="store_true",
                         help="measure again even if a cached result exists (measuring only)")
    profile.set_defaults(func=run_profile)


def run_models(args: argparse.Namespace) -> int:
    """Print the zoo (on the meta device, so listing allocates no weights)."""
    rows = []
    for name in model_names():
        model = build_model(name, device="meta")
        rows.append({"name": name, "units": len(model.units), "parameters": model.num_parameters()})
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    sys.stdout.write(f"{'model':<14}{'units':>6}{'parameters':>16}\n")
    for row in rows:
        sys.stdout.write(f"{row['name']:<14}{row['units']:>6}{row['parameters']:>16,}\n")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    """Profile ``args.model`` and write the graph to ``args.output`` (or, with ``--dry-run``, describe it)."""
    from pipeplan.models.imported import describe
    from pipeplan.models.profile_step import OPTIMIZERS
    from pipeplan.models.spec import is_zoo_spec

    zoo = is_zoo_spec(args.model)
    if zoo and args.model not in model_names():
        raise InputError("-", "model", f"unknown model {args.model!r}; valid: {', '.join(model_names())}, "
                                       "or path/to/file.py:factory, package.module:factory, hf:NAME")
    if zoo and (extra := zoo_only_options(args) + (["--trace"] if args.trace != "eager" else [])):
        raise InputError("-", extra[0], f"applies to an imported model; the zoo model {args.model} has its own "
                                        "units, inputs and configuration: drop it")
    if args.optimizer not in OPTIMIZERS:
        raise InputError("-", "--optimizer", f"unknown optimizer {args.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    if args.output is None and not args.dry_run:
        raise InputError("-", "--output", "name the graph file to write with -o GRAPH.json (or add --dry-run)")
    if args.output is not None:
        check_outputs(args, args.output)
    if zoo:
        dtype = _dtype(args.dtype)
        seq_len = None if args.seq_len is None else _integer(args.seq_len, "--seq-len", 1)
        if args.dry_run:
            return _describe_zoo(args.model, seq_len)
        graph = _analytic(args, dtype, seq_len) if args.analytic else _measured(args, dtype, seq_len)
    else:
        for flag, value in (("--seq-len", args.seq_len), ("--dtype", None if args.dtype == "float32" else args.dtype)):
            if value is not None:
                raise InputError("-", flag, "applies to zoo models; an imported model's factory sets its own "
                                            "sizes and dtype (use --model-arg or --input-shape)")
        if args.dry_run:  # the description lists the warnings
            sys.stdout.write(describe(imported_from_args(args)) + "\n")
            return 0
        imported, graph = _analytic_imported(args) if args.analytic else _measured_imported(args)
    try:
        text = dumps(graph.to_dict())
    except ValueError:  # json's word for inf or nan
        raise InputError("-", "profile", "a layer's cost or size is not a finite number; nothing written") from None
    try:
        atomic_write_text(args.output, text)
    except OSError as exc:
        raise InputError(args.output, "file", f"cannot be written: {exc.strerror or exc}") from None
    sys.stderr.write(f"wrote {args.output}: {graph.name}, {len(graph)} layers\n")
    return 0


def _describe_zoo(name: str, seq_len: int | None) -> int:
    model = build_model(name, seq_len=seq_len, device="meta")
    sys.stdout.write(f"{name}: {len(model.units)} units\n")
    for i, unit in enumerate(model.units):
        reads = ", ".join("input" if j < 0 else model.units[j].name for j in unit.inputs)
        tie = f"  [tied to {model.units[unit.tied_to].name}]" if unit.tied_to is not None else ""
        sys.stdout.write(f"  {i:>3} {unit.name:<28} reads {reads}{tie}\n")
    sys.stdout.write("edges: " + " ".join(f"{u}->{v}" for u, v in model.edges()) + "\n")
    return 0


def _warn(args: argparse.Namespace, imported: Any) -> None:
    for note in imported.warnings:
        sys.stderr.write(one_line(f"warning: {args.model}: {note}") + "\n")


def _analytic_imported(args: argparse.Namespace) -> tuple[Any, Any]:
    """The traced model and its estimated graph: counted on the meta device (no weights allocated) when
    the model's forward and the counting run there, else on the CPU (a forward reading values, ``.item()``
    or a value-dependent ``if``, needs them; so do a few operations without meta kernels)."""
    from pipeplan.models.profile_imported import analyse_imported

    device = _analytic_device(args)
    try:
        imported = imported_from_args(args, device="meta")
        graph = analyse_imported(imported, device, args.optimizer, tensor_parallel=not args.no_tensor_parallel)
    except InputError as exc:
        if exc.where != "forward" and not exc.where.startswith("unit ") and exc.where != "the units' arguments":
            raise
    else:
        _warn(args, imported)
        return imported, graph
    imported = imported_from_args(args)
    _warn(args, imported)
    return imported, analyse_imported(imported, device, args.optimizer, tensor_parallel=not args.no_tensor_parallel)


def _measured_imported(args: argparse.Namespace) -> tuple[Any, Any]:
    from pipeplan.models.profile_imported import profile_imported

    if _torch_device(args.device or MEASURE_DEFAULTS["device"]) != "cpu":
        raise InputError("-", "--device", "imported models are measured on the CPU only so far; "
                                          "profile a zoo model on the GPU, or drop --device")
    config = _measure_config(args)
    imported = imported_from_args(args)
    _warn(args, imported)
    return imported, profile_imported(imported, config, progress=sys.stderr.isatty(),
                                      tensor_parallel=not args.no_tensor_parallel)


MEASURE_DEFAULTS = {"batch_sizes": "1,2,4,8", "threads": "1", "rounds": "1", "warmup": "2", "repeats": "5",
                    "device": "cpu"}
"""What the measuring options default to (``None`` in the parser, so ``--analytic`` can tell them given)."""


def _analytic(args: argparse.Namespace, dtype: torch.dtype, seq_len: int | None) -> Any:
    from pipeplan.models.profile_analytic import profile_analytic

    return profile_analytic(args.model, device=_analytic_device(args), seq_len=seq_len, dtype=dtype,
                            optimizer=args.optimizer, tensor_parallel=not args.no_tensor_parallel)


def _analytic_device(args: argparse.Namespace) -> Any:
    """The ``--analytic`` device (measuring options refused)."""
    from pipeplan.models.profile_analytic import DeviceModel

    for key in (*MEASURE_DEFAULTS, "no_cache"):
        if getattr(args, key) not in (None, False):
            flag = "--" + key.replace("_", "-")
            raise InputError("-", flag, "describes a measurement; --analytic measures nothing: drop it")
    defaults = DeviceModel()
    return DeviceModel(
        flops=defaults.flops if args.flops is None else _number(args.flops, "--flops"),
        efficiency=defaults.efficiency if args.efficiency is None else _number(args.efficiency, "--efficiency"),
        overhead=defaults.overhead if args.overhead is None else _number(args.overhead, "--overhead"),
        bandwidth=defaults.bandwidth if args.bandwidth is None else _number(args.bandwidth, "--bandwidth"))


def _measured(args: argparse.Namespace, dtype: torch.dtype, seq_len: int | None) -> Any:
    from pipeplan.models.profile_measured import profile_measured

    config = _measure_config(args)
    device = _torch_device(args.device or MEASURE_DEFAULTS["device"])
    try:
        return profile_measured(args.model, config=config, seq_len=seq_len, dtype=dtype,
                                use_cache=not args.no_cache, progress=sys.stderr.isatty(), device=device,
                                tensor_parallel=not args.no_tensor_parallel)
    except RuntimeError as exc:
        if "alloc" not in str(exc):
            raise
        raise InputError("-", "--batch-sizes", f"the model does not fit in this machine's memory at "
                                               f"{max(config.batch_sizes)} samples; use smaller sizes") from None


def _measure_config(args: argparse.Namespace) -> Any:
    """The measurement the options describe (``--analytic``'s device options refused)."""
    from pipeplan.models.profile_measured import MeasureConfig

    for flag, value in (("--flops", args.flops), ("--efficiency", args.efficiency), ("--overhead", args.overhead),
                        ("--bandwidth", args.bandwidth)):
        if value is not None:
            raise InputError("-", flag, "describes the device of --analytic; add --analytic or drop it")
    given = {key: default if getattr(args, key) is None else getattr(args, key)
             for key, default in MEASURE_DEFAULTS.items()}
    return MeasureConfig(batch_sizes=_batch_sizes(given["batch_sizes"]),
                         warmup=_integer(given["warmup"], "--warmup", 0, MAX_REPEATS),
                         repeats=_integer(given["repeats"], "--repeats", 1, MAX_REPEATS),
                         threads=_integer(given["threads"], "--threads", 1, MAX_THREADS),
                         rounds=_integer(given["rounds"], "--rounds", 1, MAX_REPEATS),
                         optimizer=args.optimizer)


MAX_PROFILE_BATCH = 65536
"""Largest microbatch size a profile measures (a batch is allocated for real)."""
MAX_REPEATS = 100_000
"""Most warm-up runs, repeats or rounds."""
MAX_THREADS = 1024
"""Most intra-op threads."""


def _batch_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(_integer(part.strip(), "--batch-sizes", 1, MAX_PROFILE_BATCH) for part in text.split(","))
    return tuple(sorted(set(sizes)))


def _integer(text: str, flag: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InputError("-", flag, f"expected an integer, got {text!r}") from None
    return check_integer(value, "-", flag, minimum=minimum, maximum=maximum)


def _number(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError("-", flag, f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InputError("-", flag, f"must be a finite number >= 0, got {text!r}")
    return value


def _torch_device(text: str) -> str:
    """``cpu`` or an available CUDA device, checked before anything is built."""
    import torch

    if text == "cpu":
        return text
    if text != "cuda" and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise InputError("-", "--device", f"expected cpu, cuda or cuda:N, got {text!r}")
    if not torch.cuda.is_available():
        built = "without CUDA" if torch.version.cuda is None else f"with CUDA {torch.version.cuda}"
        raise InputError("-", "--device", f"CUDA is not available here (torch {torch.__version__} built {built}, "
                                          "or no GPU visible); measure with --device cpu or on a GPU machine")
    index = int(text[5:]) if text.startswith("cuda:") else 0
    if index >= torch.cuda.device_count():
        raise InputError("-", "--device", f"{text}: this machine has {torch.cuda.device_count()} CUDA devices "
                                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return text


def _dtype(text: str) -> torch.dtype:
    import torch

    if text not in DTYPES:
        raise InputError("-", "--dtype", f"unknown dtype {text!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, text)
