"""Model specs: how a model is named on the command line, and what it resolves to.

A spec is one of

- a zoo name (``gpt-tiny``): see :mod:`pipeplan.models.zoo`;
- ``path/to/file.py:factory``: the file is loaded (running its code, like any import)
  and ``factory(**model_args)`` is called;
- ``package.module:factory``: the module is imported from ``sys.path``, likewise;
- ``hf:NAME`` or ``hf:NAME:HEAD`` (``hf:gpt2``, ``hf:bart:seq2seq``): a Hugging Face
  ``transformers`` model built from its configuration with random weights,
  ``use_cache=False``, nothing downloaded; ``model_args`` override configuration
  fields (``n_layer=4``).  ``HEAD`` picks the class (:data:`HF_HEADS`); without it,
  the causal language model where the type has one, else the sequence-to-sequence
  model, else the bare model (:func:`hf_heads` lists a type's heads).

A factory returns an ``nn.Module``, ``(module, example)`` or ``(module, example,
loss)``.  ``example(n)`` returns the arguments of a batch of ``n`` samples: a tensor,
a tuple of arguments, or ``(args, kwargs)``.  ``loss(output, n)`` returns a scalar.
A module alone (an ``hf:`` model included) takes its example from an
:class:`InputSpec` (``--input-shape``, ``--input-dtype``, ``--input-high``).  Without
a loss, training minimises the *synthetic objective*: the mean of the squares of the
output (of its first floating-point tensor when the output is a tuple, a dict or a
``ModelOutput``), which exercises every parameter the output depends on.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeplan.models.errors import InputError

#: ``(args, kwargs)`` of one call of the model.
Call = tuple[tuple[Any, ...], dict[str, Any]]

INPUT_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                "int64": torch.int64}
"""``--input-dtype`` names."""


@dataclass(frozen=True)
class InputSpec:
    """The example of a module that comes alone: random tensors of one per-sample shape."""

    shape: tuple[int, ...]
    """Per-sample shape (``(3, 224, 224)``; ``(16,)`` for 16 token positions)."""
    dtype: torch.dtype = torch.float32
    """Element type; integer inputs are drawn in ``[0, high)``."""
    high: int | None = None
    """Upper bound (exclusive) of integer inputs, required with an integer dtype."""

    def __post_init__(self) -> None:
        if any(d < 1 for d in self.shape):
            raise InputError("-", "--input-shape", f"every size must be >= 1, got {','.join(map(str, self.shape))}")
        integer = not self.dtype.is_floating_point
        if integer and (self.high is None or self.high < 1):
            raise InputError("-", "--input-high", "an integer input needs --input-high N (token ids are drawn in "
                                                  f"[0, N)), got {self.high}")
        if not integer and self.high is not None:
            raise InputError("-", "--input-high", "bounds integer inputs only; drop it or add --input-dtype int64")

    def batch(self, n: int) -> torch.Tensor:
        """``n`` samples drawn from the global RNG (seed it first for repeatable draws)."""
        if self.dtype.is_floating_point:
            return torch.randn(n, *self.shape, dtype=self.dtype)
        return torch.randint(0, int(self.high or 1), (n, *self.shape), dtype=self.dtype)


@dataclass
class UserModel:
    """A model named by a spec other than a zoo name, ready to be traced and profiled."""

    name: str
    """A short name for the graph (the factory's or the ``hf:`` name)."""
    spec: str
    """The spec as given (recorded in the graph's ``profile`` field)."""
    module: nn.Module
    """The model itself."""
    example_fn: Callable[[int], Any]
    """The factory's ``example(n)`` (or one made from the :class:`InputSpec`)."""
    loss_fn: Callable[[Any, int], torch.Tensor] | None = None
    """The factory's ``loss(output, n)``, or ``None`` for the synthetic objective."""
    built: str | None = None
    """What an ``hf:`` spec built: the class and the other heads it offers (``None`` for a factory)."""
    forward_hint: str | None = None
    """A fix to add to the message when the forward fails on the example (``None``: none known)."""

    def example(self, n: int, seed: int = 0) -> Call:
        """``(args, kwargs)`` of a batch of ``n`` samples, the same for the same seed.

        Raises
        ------
        InputError
            If ``example`` raises or returns something that is not a batch's arguments.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                raw = self.example_fn(n)
            except Exception as exc:  # the user's code: any exception is bad input
                raise InputError(self.spec, "example", f"example({n}) raised {_describe(exc)}") from exc
        return normalise_call(raw, self.spec)

    def loss(self, output: Any, n: int) -> torch.Tensor:
        """The training loss of a batch of ``n`` samples (see :func:`synthetic_loss`)."""
        if self.loss_fn is None:
            return synthetic_loss(output, n)
        return self.loss_fn(output, n)

    def run(self, call: Call) -> Any:
        """The module on one call's arguments."""
        return self.module(*call[0], **call[1])


def synthetic_loss(output: Any, n: int) -> torch.Tensor:
    """The synthetic objective: the mean of the squares of the output's first floating tensor.

    A mean over every element is a mean over the samples of per-sample means, so the
    loss of a batch split into parts of ``n_k`` samples is ``sum_k (n_k / n) * loss_k``.

    Examples
    --------
    >>> synthetic_loss((torch.tensor([[1.0, 3.0]]),), 1)
    tensor(5.)
    """
    tensor = first_float(output)
    if tensor is None:
        raise InputError("-", "loss", "the model's output holds no floating-point tensor; give the factory a loss")
    return tensor.pow(2).mean()


def first_float(output: Any) -> torch.Tensor | None:
    """The first floating-point tensor among the leaves of ``output`` (tuples, dicts, ``ModelOutput``)."""
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    return None


def normalise_call(raw: Any, spec: str) -> Call:
    """``example(n)``'s result as ``(args, kwargs)``: a tensor, a tuple, or ``(args, kwargs)``."""
    if isinstance(raw, torch.Tensor):
        return (raw,), {}
    if isinstance(raw, tuple) and len(raw) == 2 and isinstance(raw[0], (tuple, list)) and isinstance(raw[1], dict):
        return tuple(raw[0]), dict(raw[1])
    if isinstance(raw, (tuple, list)):
        return tuple(raw), {}
    raise InputError(spec, "example", f"example(n) returned {type(raw).__name__}; expected a tensor, a tuple of "
                                      "arguments or (args, kwargs)")


# ------------------------------------------------------------------ resolving a spec
def is_zoo_spec(spec: str) -> bool:
    """Whether ``spec`` names a zoo model (no ``:`` in it)."""
    return ":" not in spec


def parse_model_args(items: list[str] | None) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` as keyword arguments, each VALUE parsed as JSON.

    Examples
    --------
    >>> parse_model_args(["n_layer=4", 'act="gelu"', "sizes=[1, 2]"])
    {'n_layer': 4, 'act': 'gelu', 'sizes': [1, 2]}
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise InputError("-", "--model-arg", f"expected KEY=VALUE with KEY a Python name, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            raise InputError("-", "--model-arg", f"{key}: {value!r} is not a JSON value; a string needs quotes: "
                                                 f"--model-arg '{key}=\"{value}\"'") from None
    return out


def resolve_user_model(spec: str, model_args: dict[str, Any] | None = None,
                       inputs: InputSpec | None = None, seed: int = 0) -> UserModel:
    """Build the model a non-zoo spec names.

    Parameters
    ----------
    spec : str
        ``path/to/file.py:factory``, ``package.module:factory`` or ``hf:NAME``.
    model_args : dict, optional
        Keyword arguments of the factory (configuration overrides for ``hf:``).
    inputs : InputSpec, optional
        The example of a module that comes without one.
    seed : int
        Seed of the global RNG while the factory runs (the same seed, the same weights).

    Returns
    -------
    UserModel

    Raises
    ------
    InputError
        A missing file, module or attribute; a factory that raises (its exception's
        type and message; the exception is chained for ``--debug``); a factory
        returning something else; a module alone without ``inputs``, or ``inputs``
        given where the factory makes its own example.

    Examples
    --------
    >>> resolve_user_model("hf:gpt2", {"n_layer": 2, "n_embd": 8, "n_head": 2, "vocab_size": 11},
    ...                    InputSpec((4,), torch.int64, 11)).example(3)[0][0].shape
    torch.Size([3, 4])
    """
    model_args = dict(model_args or {})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        name, result = _build(spec, model_args)
    user = _user_model(name, spec, result, inputs)
    if spec.startswith("hf:"):
        user.built, user.forward_hint = _hf_notes(spec, result)
    return user


def _build(spec: str, model_args: dict[str, Any]) -> tuple[str, Any]:
    if spec.startswith("hf:"):
        name, _, head = spec[3:].partition(":")
        return spec[3:].replace(":", "-"), build_hf(name, model_args, spec, head or None)
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise InputError("-", "model", f"{spec!r} is not a model spec: use a zoo name, path/to/file.py:factory, "
                                       "package.module:factory or hf:NAME")
    factory = _load_attribute(target, attr, spec)
    name = f"{Path(target).stem if target.endswith('.py') else target}.{attr}"
    try:
        result = factory(**model_args)
    except Exception as exc:  # the user's code: any exception is bad input
        raise InputError(spec, "factory", f"{attr}({_kwargs_text(model_args)}) raised {_describe(exc)}") from exc
    return name, result


def _user_model(name: str, spec: str, result: Any, inputs: InputSpec | None) -> UserModel:
    parts = result if isinstance(result, tuple) else (result,)
    if not 1 <= len(parts) <= 3 or not isinstance(parts[0], nn.Module) \
            or any(not callable(p) for p in parts[1:]):
        got = type(result).__name__ + (f" of {len(parts)}" if isinstance(result, tuple) else "")
        raise InputError(spec, "factory", f"returned {got}; expected an nn.Module, (module, example) or "
                                          "(module, example, loss) with example and loss callable")
    module = parts[0]
    if len(parts) == 1:
        if inputs is None:
            raise InputError(spec, "example", "the factory returns a module alone: give the per-sample input with "
                                              "--input-shape (e.g. 3,224,224) and --input-dtype (int64 with "
                                              "--input-high N for token ids), or return (module, example)")
        example_fn: Callable[[int], Any] = inputs.batch
    else:
        if inputs is not None:
            raise InputError(spec, "--input-shape", "the factory makes its own example; drop --input-shape, "
                                                    "--input-dtype and --input-high")
        example_fn = parts[1]
    return UserModel(name, spec, module, example_fn, parts[2] if len(parts) == 3 else None)


def _load_attribute(target: str, attr: str, spec: str) -> Any:
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(Path(target), spec)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name and target.startswith(exc.name):
                raise InputError(spec, "model", f"no module named {exc.name!r} on the Python path") from exc
            raise InputError(spec, "import", f"importing {target} raised {_describe(exc)}") from exc
        except Exception as exc:
            raise InputError(spec, "import", f"importing {target} raised {_describe(exc)}") from exc
    if not hasattr(module, attr):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else (f"; it has {', '.join(names[:8])}" if names else "")
        raise InputError(spec, "factory", f"{target} has no attribute {attr!r}{hint}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise InputError(spec, "factory", f"{target}:{attr} is a {type(factory).__name__}, not a callable factory")
    return factory


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise InputError(str(path), "file", "no such file" if not path.exists() else "is not a file")
    # A name of its own per file, so two user files called model.py do not collide.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"pipeplan_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(str(path), "file", "cannot be loaded as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any exception is bad input
        del sys.modules[name]
        raise InputError(str(path), "import", f"loading it raised {_describe(exc)}") from exc
    return module


HF_HEADS = {"causal": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM", "masked": "AutoModelForMaskedLM",
            "base": "AutoModel"}
"""``hf:NAME:HEAD`` -> the ``transformers`` auto class that builds it (a causal LM, an encoder-decoder
with its LM head, a masked LM, the bare model)."""


def hf_heads(config: Any) -> list[str]:
    """The heads of :data:`HF_HEADS` that ``transformers`` has for ``config``'s model type, in that order."""
    import transformers

    return [head for head, auto in HF_HEADS.items() if type(config) in getattr(transformers, auto)._model_mapping]


def build_hf(name: str, overrides: dict[str, Any], spec: str, head: str | None = None) -> nn.Module:
    """A ``transformers`` model of type ``name`` from its default configuration, random weights.

    ``head`` names the class (:data:`HF_HEADS`); ``None``: the causal language model
    (``AutoModelForCausalLM``) where the type has one, else the sequence-to-sequence
    model, else the bare model (``AutoModel``).  ``use_cache`` is off (cache objects
    cannot cross a pipeline cut) and attention is the eager implementation (exact in
    float64).
    """
    try:
        import transformers
    except ImportError:
        raise InputError(spec, "model", "hf: models need transformers: pip install 'pipeplan[hf]'") from None
    transformers.logging.set_verbosity_error()
    known = list(transformers.CONFIG_MAPPING.keys())
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        raise InputError(spec, "model", f"transformers has no model type {name!r}"
                                        + (f"; closest: {', '.join(close)}" if close else ""))
    defaults = transformers.AutoConfig.for_model(name)
    heads = hf_heads(defaults)
    if head is not None and head not in heads:
        raise InputError(spec, "model", f"{name} has no head {head!r} in transformers; it has "
                                        f"{', '.join(f'hf:{name}:{h}' for h in heads)}")
    head = head or next((h for h in ("causal", "seq2seq") if h in heads), "base")
    unknown = sorted(k for k in overrides if not hasattr(defaults, k))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(defaults.to_dict()), n=3)
        raise InputError(spec, "--model-arg", f"{', '.join(unknown)}: not a field of {type(defaults).__name__}"
                                              + (f"; closest: {', '.join(close)}" if close else ""))
    try:
        config = transformers.AutoConfig.for_model(name, **overrides)
    except Exception as exc:
        raise InputError(spec, "--model-arg", f"configuration {name} raised {_describe(exc)}") from exc
    config.use_cache = False
    config._attn_implementation = "eager"
    try:
        return getattr(transformers, HF_HEADS[head]).from_config(config)
    except Exception as exc:
        raise InputError(spec, "factory", f"building {name} from its configuration raised {_describe(exc)}") from exc


def _hf_notes(spec: str, model: nn.Module) -> tuple[str, str | None]:
    """``UserModel.built`` and ``forward_hint`` of an ``hf:`` model."""
    name = spec[3:].partition(":")[0]
    heads = hf_heads(model.config)
    built = f"{type(model).__name__} (heads: {', '.join(f'hf:{name}:{h}' for h in heads)})"
    hint = None
    if getattr(model.config, "is_encoder_decoder", False):
        hint = (f"an hf: model gets one input, input_ids; when {type(model).__name__} needs decoder_input_ids too, "
                "write a factory whose example(n) returns ((input_ids,), {'decoder_input_ids': ...}) (it "
                "profiles and plans; pipeplan run and export feed one input tensor)")
    return built, hint


def _describe(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def parse_input_spec(shape: str | None, dtype: str | None, high: str | None) -> InputSpec | None:
    """``--input-shape/--input-dtype/--input-high`` as an :class:`InputSpec` (``None`` without a shape).

    Examples
    --------
    >>> parse_input_spec("16", "int64", "50257")
    InputSpec(shape=(16,), dtype=torch.int64, high=50257)
    """
    if shape is None:
        for flag, value in (("--input-dtype", dtype), ("--input-high", high)):
            if value is not None:
                raise InputError("-", flag, "describes --input-shape, which is not given")
        return None
    try:
        sizes = tuple(int(part) for part in shape.split(","))
    except ValueError:
        raise InputError("-", "--input-shape", f"expected sizes like 3,224,224, got {shape!r}") from None
    if dtype is not None and dtype not in INPUT_DTYPES:
        raise InputError("-", "--input-dtype", f"unknown dtype {dtype!r}; valid: {', '.join(INPUT_DTYPES)}")
    bound = None
    if high is not None:
        try:
            bound = int(high)
        except ValueError:
            raise InputError("-", "--input-high", f"expected an integer, got {high!r}") from None
    return InputSpec(sizes, INPUT_DTYPES[dtype or "float32"], bound)
