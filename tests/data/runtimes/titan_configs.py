"""torchtitan 0.3 configs for the export tests: its llama3 debug model with the decoder layers of the graphs tested."""

from torchtitan.models.llama3.config_registry import llama3_debugmodel


def llama3_4_layers():
    """torchtitan's ``llama3_debugmodel`` with 4 decoder layers (gpt-tiny's blocks) instead of 6."""
    config = llama3_debugmodel()
    config.model_spec.model.layers = config.model_spec.model.layers[:4]
    return config
