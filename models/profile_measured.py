"""Measure a zoo model on this machine and turn it into a ``pipeplan.graph/2`` layer graph.

Per unit: forward and backward seconds at several microbatch sizes (warm-up runs,
then the median of repeats, with a fixed torch thread count), fitted to ``a + b*n``;
saved-activation bytes per sample (``saved_tensors_hooks``, de-duplicated by storage,
parameters and buffers left out); output bytes per sample; parameter bytes.  Results
are cached as JSON, keyed by model, configuration, batch sizes, torch and machine.

The version-2 fields (spec section 7.1):

- ``bwd_w``: after the forward-backward repeats, as many repeats of an untimed
  forward and the timed input-gradient-only backward
  (:func:`pipeplan.models.profile_split.input_backward`, ``torch.autograd.grad`` with
  respect to the unit's inputs); the weight part at each
  size is the median whole backward minus the median input-gradient backward, fitted
  to ``a + b*n`` and clamped to ``0 <= bwd_w <= bwd`` per coefficient, since the two
  are timed in different runs and timing noise can make the difference negative or
  larger than the whole.  A unit none of whose inputs needs a gradient (the
  embedding) has an empty input-gradient half: its ``bwd_w`` is its ``bwd``.
- ``act_w``: bytes per sample of the saved tensors that the weight-gradient half
  unpacks when the backward runs as torch's ``stage_backward_input`` then
  ``stage_backward_weight`` (:func:`pipeplan.models.profile_split.split_backward`),
  clamped to ``act``.
- ``step``: the median seconds of the optimizer step (Adam by default,
  ``MeasureConfig.optimizer``) over the unit's parameters
  (:func:`pipeplan.models.profile_step.median_step`); 0 without parameters.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from pipeplan.models.cache import cache_key, load_cached, machine, store_cached
from pipeplan.models.errors import InputError
from pipeplan.models.fit import LinearFit, clamp_part, fit_linear
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.profile_split import SavedTensorLog, grad_inputs, input_backward, split_backward
from pipeplan.models.profile_units import leaf_args, param_bytes, per_sample, unit_args
from pipeplan.models.profile_step import OPTIMIZERS, median_step
from pipeplan.models.zoo import ZooModel, build_model

#: Bumped when the measuring method changes, so old cache entries are not reused.
PROFILE_VERSION = 4  # 2: the last unit is timed with the loss; 3: F and B alternate; 4: graph/2 fields


@dataclass(frozen=True)
class MeasureConfig:
    """How to measure."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Microbatch sizes to time (at least one; two or more to separate ``a`` from ``b``)."""
    warmup: int = 2
    """Untimed runs before timing each op (allocator and kernel warm-up)."""
    repeats: int = 5
    """Timed runs per op and round; the median over all rounds is kept."""
    rounds: int = 1
    """Passes over every (batch size, unit), each timing ``repeats`` runs of each op.

    On a shared machine a slow spell lasts seconds: with one round it inflates every
    sample of the ops timed meanwhile; with several, an op's samples come from
    different moments and the median leaves the spell out."""
    threads: int = 1
    """``torch.set_num_threads`` during the measurement, for repeatable timings."""
    seed: int = 0
    """Seed of the weights and of the example batches."""
    optimizer: str = "adam"
    """Optimizer whose step is timed per unit (one of :data:`pipeplan.models.profile_step.OPTIMIZERS`)."""

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise InputError("-", "optimizer", f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        if not self.batch_sizes or any(n < 1 for n in self.batch_sizes):
            raise InputError("-", "batch_sizes", f"need one or more positive sizes, got {list(self.batch_sizes)}")
        if self.warmup < 0 or self.repeats < 1 or self.threads < 1 or self.rounds < 1:
            raise InputError("-", "measure", "need warmup >= 0, repeats >= 1, threads >= 1 and rounds >= 1, got "
                             f"{self.warmup}, {self.repeats}, {self.threads}, {self.rounds}")


@dataclass
class UnitProfile:
    """What was measured for one unit."""

    fwd: LinearFit
    """Forward seconds as ``a + b*n``."""
    bwd: LinearFit
    """Backward seconds as ``a + b*n``."""
    params: int
    """Bytes of the unit's parameters (a tied weight included)."""
    act: float
    """Saved-activation bytes per sample."""
    out: float
    """Output bytes per sample."""
    samples: dict[str, list[float]] = field(default_factory=dict)
    """Raw median seconds per batch size: ``{"fwd": [...], "bwd": [...], "bwd_i": [...]}`` (input-gradient half)."""
    bwd_w: LinearFit | None = None
    """Weight-gradient part of ``bwd`` as ``a + b*n`` (graph/2 ``bwd_w``); ``None``: not profiled."""
    act_w: float | None = None
    """Saved bytes per sample the weight gradient still needs after the input gradient; ``None``: not profiled."""
    step: float | None = None
    """Optimizer-step seconds for the unit's parameters; ``None``: not profiled."""


# ------------------------------------------------------------------ helpers shared with the analytic profiler
def saved_bytes(module: nn.Module, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run ``module(*args)`` and count the bytes autograd saves for the backward pass.

    Saved tensors are de-duplicated by storage (whole storages are kept alive, views
    included); storages of the module's parameters and buffers are left out: they
    are not activations.

    Returns
    -------
    (output, bytes)
    """
    log = SavedTensorLog(module)
    with log.hooks():
        output = module(*args)
    return output, log.saved_bytes()


def out_bytes(output: torch.Tensor) -> int:
    """Bytes of one tensor."""
    return output.numel() * output.element_size()


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run with ``torch.set_num_threads(threads)``, restoring the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------ timing
def time_unit(module: nn.Module, args: Sequence[torch.Tensor], warmup: int, repeats: int,
              pause: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median forward and backward seconds of ``module`` on ``args`` (see :func:`time_unit_samples`)."""
    fwd, bwd = time_unit_samples(module, args, warmup, repeats, pause)
    return statistics.median(fwd), statistics.median(bwd)


def time_unit_samples(module: nn.Module, args: Sequence[torch.Tensor], warmup: int, repeats: int,
                      pause: Callable[[], None] | None = None,
                      sync: Callable[[], None] | None = None) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``module`` on ``args``, one per timed repeat.

    Each repeat runs a forward and then its backward, both timed, as a pipeline stage
    runs them: timing each in a tight loop of its own measured caches that stay warm
    only in a benchmark, and came out 10-15 % below what the runtime sees.  Parameter
    gradients accumulate across repeats, as over a pipeline's microbatches.  ``pause``,
    if given, runs untimed before every forward and every backward (a wait, say).  ``sync``,
    if given, runs before each clock reading: on a GPU, where kernels run asynchronously,
    ``torch.cuda.synchronize`` makes the clock see the work finished.
    """
    wait = pause or (lambda: None)
    clock = _clock(sync or (lambda: None))
    leaves = leaf_args(args)
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        wait()
        output, f = clock(lambda: module(*leaves))
        wait()
        # a unit computing from buffers alone (a rotary table) has no backward
        _, b = clock(lambda: output.backward(torch.ones_like(output)) if output.requires_grad else None)
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    module.zero_grad(set_to_none=True)
    return fwd, bwd


def time_input_samples(module: nn.Module, args: Sequence[torch.Tensor], warmup: int, repeats: int,
                       sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds of the input-gradient-only backward of ``module`` on ``args``, one per timed repeat.

    Each repeat runs an untimed forward, then times
    :func:`~pipeplan.models.profile_split.input_backward` of its output.  A unit none
    of whose inputs needs a gradient has nothing to time: its samples are 0.
    """
    leaves = leaf_args(args)
    if not grad_inputs(leaves):
        return [0.0] * repeats
    clock = _clock(sync or (lambda: None))
    samples = []
    for i in range(warmup + repeats):
        output = module(*leaves)
        _, seconds = clock(lambda: input_backward(output, leaves))
        if i >= warmup:
            samples.append(seconds)
    return samples


def _clock(sync: Callable[[], None]) -> Callable[[Callable[[], Any]], tuple[Any, float]]:
    """``clock(work) -> (result, seconds)``, synchronising before each reading."""
    def clock(work: Callable[[], Any]) -> tuple[Any, float]:
        sync()
        start = time.perf_counter()
        result = work()
        sync()
        return result, time.perf_counter() - start
    return clock


class _WithLoss(nn.Module):
    """A unit followed by the model's loss: what the last stage runs per microbatch."""

    def __init__(self, unit: nn.Module, model: ZooModel, targets: torch.Tensor) -> None:
        super().__init__()
        self.unit = unit
        self.model = model
        self.targets = targets

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model.loss(self.unit(*args), self.targets)


# ------------------------------------------------------------------ the profiler
#: One unit's work at one batch size: ``(module, args, timed)``.  ``module(*args)`` is the
#: unit (its saved activations and output are counted); ``timed`` is what a stage runs
#: per microbatch (the unit itself, or the last unit followed by the loss).
UnitWork = tuple[nn.Module, Sequence[torch.Tensor], nn.Module]


def measure_model(model: ZooModel, config: MeasureConfig, *, progress: bool = False) -> list[UnitProfile]:
    """Measure every unit of a built zoo model, on the device it was built on; see :func:`profile_measured`."""
    last = len(model.units) - 1

    def work(n: int) -> list[UnitWork]:
        inputs, targets = model.example_batch(n, config.seed)
        # Training computes the loss right after the last unit, on the same stage:
        # time it as part of that unit, as the runtime runs it.
        return [(unit.module, args, _WithLoss(unit.module, model, targets) if i == last else unit.module)
                for i, (unit, args) in enumerate(zip(model.units, unit_args(model, inputs)))]

    sync = (lambda: torch.cuda.synchronize(model.device)) if model.device.type == "cuda" else None
    return measure_units([u.name for u in model.units], [u.module for u in model.units], work, config,
                         progress=progress, sync=sync)


def measure_units(names: Sequence[str], modules: Sequence[nn.Module], work: Callable[[int], list[UnitWork]],
                  config: MeasureConfig, *, progress: bool = False,
                  sync: Callable[[], None] | None = None, user_spec: str | None = None) -> list[UnitProfile]:
    """Time units on this machine: rounds of every (batch size, unit), the median kept, fitted.

    Parameters
    ----------
    names, modules : sequence
        The units' names (for the progress display) and modules (for parameter bytes).
    work : callable
        ``work(n)`` gives each unit's :data:`UnitWork` for a batch of ``n`` samples.
    config : MeasureConfig
        Batch sizes, warm-up, repeats, rounds, threads.
    sync : callable, optional
        Called around every timed forward and backward (``torch.cuda.synchronize`` on a GPU).
    user_spec : str, optional
        The spec of a user's model: an exception its code raises while a unit is
        measured becomes an :class:`InputError` naming the unit (:func:`unit_errors`).

    Returns
    -------
    list of UnitProfile
        ``out`` is the bytes per sample of ``module(*args)``'s output; ``act`` and
        ``act_w`` are counted on ``module`` too (:func:`~pipeplan.models.profile_split.split_backward`),
        the times on ``timed``; ``step`` is timed after all rounds (``config.warmup``
        untimed and ``repeats * rounds`` timed steps).
    """
    sizes = list(config.batch_sizes)
    # samples[i][size index]: (forward, backward, input-gradient backward) seconds of unit i, over all rounds
    samples: list[list[tuple[list[float], list[float], list[float]]]] = [[([], [], []) for _ in sizes]
                                                                         for _ in names]
    acts: list[list[tuple[float, float]]] = [[] for _ in names]  # (act, act_w) bytes per size
    outs: list[float] = [0.0] * len(names)
    total = config.rounds * len(sizes) * len(names) + len(names)
    with torch_threads(config.threads), _progress(progress, total) as advance:
        for round_ in range(config.rounds):
            for k, n in enumerate(sizes):
                with unit_errors(user_spec, "the units' arguments", n):
                    units_work = work(n)
                for i, (module, args, timed) in enumerate(units_work):
                    with unit_errors(user_spec, f"unit {names[i]}", n):
                        if round_ == 0:
                            split = split_backward(module, leaf_args(args))
                            acts[i].append((float(split.act), float(split.act_w)))
                            outs[i] = split.out / n
                        f, b = time_unit_samples(timed, args, config.warmup, config.repeats, sync=sync)
                        inp = time_input_samples(timed, args, config.warmup, config.repeats, sync=sync)
                    for kept, new in zip(samples[i][k], (f, b, inp)):
                        kept.extend(new)
                    advance(f"{names[i]} n={n}" + (f" (round {round_ + 1})" if config.rounds > 1 else ""))
        steps = []
        for name, module in zip(names, modules):
            with unit_errors(user_spec, f"unit {name}", 0):
                steps.append(median_step(module, config.optimizer, config.warmup, config.repeats * config.rounds,
                                         sync))
            advance(f"{name} {config.optimizer} step")
    return [_unit_profile(sizes, samples[i], acts[i], outs[i], steps[i], module) for i, module in enumerate(modules)]


def _unit_profile(sizes: Sequence[int], samples: Sequence[tuple[list[float], list[float], list[float]]],
                  acts: Sequence[tuple[float, float]], out: float, step: float, module: nn.Module) -> UnitProfile:
    """One unit's profile from its samples per size (see :func:`measure_units`)."""
    fwd_t, bwd_t, input_t = ([statistics.median(kind) for kind in per_size] for per_size in zip(*samples))
    bwd = fit_linear(sizes, bwd_t)
    # The weight half is the whole minus the input half; clamp_part keeps it within bwd (timing noise).
    bwd_w = clamp_part(fit_linear(sizes, [b - i for b, i in zip(bwd_t, input_t)]), bwd)
    act = per_sample(sizes, [a for a, _ in acts])
    act_w = min(per_sample(sizes, [w for _, w in acts]), act)
    return UnitProfile(fit_linear(sizes, fwd_t), bwd, param_bytes(module), act, out,
                       {"fwd": fwd_t, "bwd": bwd_t, "bwd_i": input_t}, bwd_w, act_w, step)


@contextmanager
def unit_errors(spec: str | None, where: str, n: int) -> Iterator[None]:
    """Report an exception of a user's model code while profiling ``where`` as one :class:`InputError`.

    ``spec`` ``None`` (a zoo model): exceptions pass unchanged, a failure there is
    pipeplan's.  The message names the unit and the batch size, and the fixes a user
    can apply; ``--debug`` shows the chained traceback.
    """
    if spec is None:
        yield
        return
    try:
        yield
    except InputError:
        raise
    except Exception as exc:  # the user's code: any exception is bad input
        lines = str(exc).strip().splitlines()
        message = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        size = f" on {n} samples" if n else ""
        raise InputError(spec, where, f"profiling it{size} raised {message}; add --debug for the traceback, "
                                      "make this module part of a larger unit (--units with its parent), or "
                                      "estimate with --analytic") from exc


@contextmanager
def _progress(show: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar on stderr (a no-op when ``show`` is false)."""
    if not show:
        yield lambda _label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("", total=total)
        yield lambda label: bar.update(task, advance=1, description=label)


def to_graph(model: ZooModel, profiles: Sequence[UnitProfile], source: dict[str, Any]) -> LayerGraph:
    """The layer graph of ``model`` with the given per-unit profiles.

    The graph is named ``<model>-<units>`` (``gpt1-14``); ``source`` is stored as its
    ``profile`` field, each layer's fit residuals as ``fit``.
    """
    layers = [Layer(unit.name, prof.fwd.as_pair(), prof.bwd.as_pair(), float(prof.params), float(prof.act),
                    float(prof.out), unit.tied_to, *version2_fields(prof), extra={"fit": fit_residuals(prof)})
              for unit, prof in zip(model.units, profiles)]
    return LayerGraph(f"{model.name}-{len(model.units)}", layers, model.edges(),
                      float(model.input_bytes_per_sample), extra={"profile": source})


def fit_residuals(prof: UnitProfile) -> dict[str, float]:
    """The layer's ``fit`` field: residuals of the fitted times (``bwd_w``'s when profiled)."""
    fits = {"fwd": prof.fwd, "bwd": prof.bwd, **({"bwd_w": prof.bwd_w} if prof.bwd_w is not None else {})}
    residuals = {f"{kind}_residual": fit.residual for kind, fit in fits.items()}
    residuals.update({f"{kind}_relative_residual": fit.relative_residual for kind, fit in fits.items()})
    return residuals


def version2_fields(prof: UnitProfile) -> tuple[tuple[float, float] | None, float | None, float | None]:
    """The layer's ``(bwd_w, act_w, step)`` from a profile (``None`` where not profiled)."""
    bwd_w = None if prof.bwd_w is None else prof.bwd_w.as_pair()
    return bwd_w, None if prof.act_w is None else float(prof.act_w), prof.step


def profile_measured(name: str, *, config: MeasureConfig | None = None, seq_len: int | None = None,
                     dtype: torch.dtype = torch.float32, use_cache: bool = True,
                     progress: bool = False, device: str = "cpu", tensor_parallel: bool = True) -> LayerGraph:
    """Measure the zoo model ``name`` on this machine and return its layer graph.

    Parameters
    ----------
    name : str
        A zoo model name.
    config : MeasureConfig, optional
        Batch sizes, warm-up, repeats, threads, seed (defaults: 1,2,4,8; 2; 5; 1; 0).
    seq_len : int, optional
        Tokens per sample for sequence models.
    dtype : torch.dtype
        Parameter and activation dtype.
    use_cache : bool
        Reuse and store results under :func:`pipeplan.models.cache.cache_dir`.
    progress : bool
        Show a rich progress bar on stderr.
    device : str
        Where to measure: ``cpu`` or a CUDA device (``cuda``, ``cuda:1``); the graph's
        ``profile.device`` names a GPU measured on.
    tensor_parallel : bool
        Give the layers with a known tensor-parallel plan their ``tp_share`` and
        ``tp_comm``, counted on the model (:mod:`pipeplan.models.profile_tp`; not cached:
        counting is one forward pass at 1 and 2 samples).

    Returns
    -------
    LayerGraph
        With ``edges`` from the units' inputs, ``tied_to`` for tied units, and a
        ``profile`` field describing how it was measured.

    Raises
    ------
    InputError
        For an unknown model, a bad ``seq_len`` or a bad configuration.

    Examples
    --------
    >>> g = profile_measured("gpt-tiny", config=MeasureConfig((1, 2), 0, 1), use_cache=False)
    >>> g.name, len(g), g.layers[-1].tied_to
    ('gpt-tiny-6', 6, 0)
    """
    config = config or MeasureConfig()
    model = build_model(name, seq_len=seq_len, dtype=dtype, seed=config.seed, device=device)
    source = {"method": "measured", "version": PROFILE_VERSION, "model": name, "config": model.config,
              "measure": asdict(config), "machine": machine()}
    if model.device.type == "cuda":  # part of the cache key: another GPU, another measurement
        source["device"] = {"type": "cuda", "name": torch.cuda.get_device_name(model.device)}
    source["measure"]["batch_sizes"] = list(config.batch_sizes)
    key = cache_key("measured", {k: v for k, v in source.items() if k != "machine"})
    graph = None
    if use_cache and (cached := load_cached("measured", key)) is not None:
        try:
            graph = LayerGraph.from_dict(cached)
        except InputError:
            pass  # a damaged entry: measure again and overwrite it
    if graph is None:
        graph = to_graph(model, measure_model(model, config, progress=progress), source)
        if use_cache:
            store_cached("measured", key, graph.to_dict())
    if not tensor_parallel:
        return graph
    from pipeplan.models.profile_tp import with_tensor_parallel, zoo_work  # it imports this module

    with torch_threads(config.threads):
        return with_tensor_parallel(graph, [(u.name, u.module) for u in model.units], zoo_work(model, config.seed))
