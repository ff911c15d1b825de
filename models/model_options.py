"""The options that name a model: `profile`, `run` and `calibrate` share them.

A model spec is a zoo name, ``path/to/file.py:factory``, ``package.module:factory``
or ``hf:NAME`` (see :mod:`pipeplan.models.spec`).  The options are added without importing
torch (every command's ``--help`` stays fast); the model is built, with torch, on use.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipeplan.models.errors import InputError

if TYPE_CHECKING:
    from pipeplan.models.imported import ImportedModel

TRACE_CHOICES = ("eager", "export", "both")
"""``--trace`` choices: :data:`pipeplan.models.imported.TRACES` (that module imports torch, which building the
parser must not; a test holds the two equal)."""

SPEC_HELP = ("a zoo model, path/to/file.py:factory, package.module:factory or hf:NAME[:HEAD] (a transformers "
             "model from its configuration, random weights, no download; HEAD causal, seq2seq, masked or base, "
             "default the causal LM, else seq2seq, else base). Loading a file or module runs its code, "
             "like any Python import")


def add_model_options(p: argparse.ArgumentParser, trace: bool = True) -> None:
    """Add ``--model-arg``, ``--input-shape/-dtype/-high``, ``--units``, ``--trace`` (if ``trace``) and ``--debug``.

    ``run`` and ``calibrate`` find the dataflow eagerly (their ``--trace`` is the Chrome trace).
    """
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE",
                   help="keyword argument of the factory (hf: a configuration field), VALUE in JSON; repeatable")
    p.add_argument("--input-shape", metavar="D,D,...",
                   help="per-sample input shape of a module that comes without an example (3,224,224; 16 tokens)")
    p.add_argument("--input-dtype", metavar="DTYPE", help="float32 (default), float64, bfloat16 or int64")
    p.add_argument("--input-high", metavar="N", help="integer inputs are drawn in [0, N) (token ids)")
    p.add_argument("--units", default="auto", metavar="auto|FQN,...",
                   help="partition units: auto (the outermost ModuleLists holding at least half the parameters "
                        "of the largest, one unit per item, plus the sibling modules on the paths to them; else the "
                        "top-level children) or qualified submodule names (a ModuleList's name means each of its "
                        "items)")
    if trace:
        p.add_argument("--trace", default="eager", choices=TRACE_CHOICES,
                       help="how the dataflow is found: eager (hooks and tagged tensors, any Python), export "
                            "(torch.export), or both (eager, cross-checked with export; a disagreement is a warning)")
    p.add_argument("--debug", action="store_true", help="on an error in the model's own code, show its traceback")


def imported_from_args(args: argparse.Namespace, device: str = "cpu") -> "ImportedModel":
    """The imported model the options name (a spec that is not a zoo name), on ``device``."""
    return request_from_args(args).trace(trace=args.trace, device=device)


def zoo_only_options(args: argparse.Namespace) -> list[str]:
    """The model options given that a zoo model does not take (their flags)."""
    given = [("--model-arg", args.model_arg), ("--input-shape", args.input_shape),
             ("--input-dtype", args.input_dtype), ("--input-high", args.input_high),
             ("--units", None if args.units == "auto" else args.units)]
    return [flag for flag, value in given if value is not None]


@dataclass(frozen=True)
class ModelRequest:
    """A model as the command line names it: the spec and the options that go with it."""

    spec: str
    """Zoo name, ``file.py:factory``, ``package.module:factory`` or ``hf:NAME``."""
    model_args: tuple[str, ...] = ()
    """``--model-arg`` items, ``KEY=VALUE``."""
    input_shape: str | None = None
    """``--input-shape``."""
    input_dtype: str | None = None
    """``--input-dtype``."""
    input_high: str | None = None
    """``--input-high``."""
    units: str = "auto"
    """``--units``."""

    @property
    def is_zoo(self) -> bool:
        from pipeplan.models.spec import is_zoo_spec

        return is_zoo_spec(self.spec)

    @property
    def factory_file(self) -> str | None:
        """The file of a ``path/to/file.py:factory`` spec (``None`` for other specs)."""
        target, sep, _ = self.spec.rpartition(":")
        if sep and not self.spec.startswith("hf:") and (target.endswith(".py") or "/" in target or "\\" in target):
            return target
        return None

    def absolute(self) -> "ModelRequest":
        """The same request with a factory file's path made absolute (processes may start elsewhere)."""
        target = self.factory_file
        if target is None:
            return self
        return replace(self, spec=f"{os.path.abspath(target)}:{self.spec.rpartition(':')[2]}")

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON data (the graph's ``profile.request``; :meth:`from_dict` reads it)."""
        return {"spec": self.spec, "model_args": list(self.model_args), "input_shape": self.input_shape,
                "input_dtype": self.input_dtype, "input_high": self.input_high, "units": self.units}

    @classmethod
    def from_dict(cls, data: Any, file: str = "-", where: str = "profile.request") -> "ModelRequest":
        """The request :meth:`to_dict` wrote; a field of another type is an :class:`InputError`."""
        if not isinstance(data, dict) or not isinstance(data.get("spec"), str):
            raise InputError(file, where, "expected an object with a string spec")
        args = data.get("model_args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InputError(file, f"{where}.model_args", "expected a list of KEY=VALUE strings")
        for key in ("input_shape", "input_dtype", "input_high"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise InputError(file, f"{where}.{key}", "expected a string or null")
        units = data.get("units", "auto")
        if not isinstance(units, str):
            raise InputError(file, f"{where}.units", "expected a string")
        return cls(data["spec"], tuple(args), data.get("input_shape"), data.get("input_dtype"),
                   data.get("input_high"), units)

    def argv(self) -> list[str]:
        """The options again, for a worker's command line (a file spec made absolute: workers start elsewhere)."""
        out = ["--model", self.absolute().spec, "--units", self.units]
        out += [item for arg in self.model_args for item in ("--model-arg", arg)]
        for flag, value in (("--input-shape", self.input_shape), ("--input-dtype", self.input_dtype),
                            ("--input-high", self.input_high)):
            if value is not None:
                out += [flag, value]
        return out

    def trace(self, seed: int = 0, trace: str = "eager", device: str = "cpu") -> "ImportedModel":
        """The imported model (not for a zoo name), built and traced under ``torch.device(device)``."""
        import torch

        from pipeplan.models.imported import trace_model
        from pipeplan.models.spec import parse_input_spec, parse_model_args, resolve_user_model

        inputs = parse_input_spec(self.input_shape, self.input_dtype, self.input_high)
        with torch.device(device):
            user = resolve_user_model(self.spec, parse_model_args(list(self.model_args)), inputs, seed)
            imported = trace_model(user, self.units, trace)
        imported.request = self.absolute()
        return imported


def request_from_args(args: argparse.Namespace) -> ModelRequest:
    """The :class:`ModelRequest` of parsed options (zoo-only option checks included)."""
    request = ModelRequest(args.model, tuple(args.model_arg or ()), args.input_shape, args.input_dtype,
                           args.input_high, args.units)
    if request.is_zoo and (extra := zoo_only_options(args)):
        raise InputError("-", extra[0], f"applies to an imported model; the zoo model {args.model} has its own "
                                        "units, inputs and configuration: drop it")
    return request
