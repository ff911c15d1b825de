"""torchtitan 0.3 configs matching pipeplan's gpt-tiny: its llama3 debug model with gpt-tiny's 4 decoder layers.

Used by `make demo` and the export tests: `pipeplan export PLAN --to torchtitan --torchtitan-model
titan_configs:llama3_4_layers` with this folder on PYTHONPATH (the config's module names must be the
plan's: torchtitan's own debug model has 6 layers, gpt-tiny 4)."""

from torchtitan.models.llama3.config_registry import llama3_debugmodel


def llama3_4_layers():
    """torchtitan's ``llama3_debugmodel`` with 4 decoder layers (gpt-tiny's blocks) instead of 6."""
    config = llama3_debugmodel()
    config.model_spec.model.layers = config.model_spec.model.layers[:4]
    return config
