"""The options that name a model: `profile`, `run` and `calibrate` share them.

A model spec is a zoo name, ``path/to/file.py:factory``, ``package.module:factory``
or ``hf:NAME`` (see :mod:`pipeplan.models.spec`).
"""

from __future__ import annotations

import argparse

from pipeplan.models.imported import TRACES, ImportedModel, trace_model
from pipeplan.models.spec import parse_input_spec, parse_model_args, resolve_user_model

SPEC_HELP = ("a zoo model, path/to/file.py:factory, package.module:factory or hf:NAME (a transformers model "
             "from its configuration, random weights, no download). Loading a file or module runs its code, "
             "like any Python import")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Add ``--model-arg``, ``--input-shape/-dtype/-high``, ``--units``, ``--trace`` and ``--debug``."""
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE",
                   help="keyword argument of the factory (hf: a configuration field), VALUE in JSON; repeatable")
    p.add_argument("--input-shape", metavar="D,D,...",
                   help="per-sample input shape of a module that comes without an example (3,224,224; 16 tokens)")
    p.add_argument("--input-dtype", metavar="DTYPE", help="float32 (default), float64, bfloat16 or int64")
    p.add_argument("--input-high", metavar="N", help="integer inputs are drawn in [0, N) (token ids)")
    p.add_argument("--units", default="auto", metavar="auto|FQN,...",
                   help="partition units: auto (the longest ModuleList, one unit per item, plus the sibling modules "
                        "on the path to it; else the top-level children) or qualified submodule names (a "
                        "ModuleList's name means each of its items)")
    p.add_argument("--trace", default="eager", choices=TRACES,
                   help="how the dataflow is found: eager (hooks and tagged tensors, any Python), export "
                        "(torch.export), or both (eager, cross-checked with export; a disagreement is a warning)")
    p.add_argument("--debug", action="store_true", help="on an error in the model's own code, show its traceback")


def imported_from_args(args: argparse.Namespace) -> ImportedModel:
    """The imported model the options name (a spec that is not a zoo name)."""
    inputs = parse_input_spec(args.input_shape, args.input_dtype, args.input_high)
    user = resolve_user_model(args.model, parse_model_args(args.model_arg), inputs)
    return trace_model(user, args.units, args.trace)


def zoo_only_options(args: argparse.Namespace) -> list[str]:
    """The model options given that a zoo model does not take (their flags)."""
    given = [("--model-arg", args.model_arg), ("--input-shape", args.input_shape),
             ("--input-dtype", args.input_dtype), ("--input-high", args.input_high),
             ("--units", None if args.units == "auto" else args.units),
             ("--trace", None if args.trace == "eager" else args.trace)]
    return [flag for flag, value in given if value is not None]
