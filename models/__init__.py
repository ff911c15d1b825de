"""pipeplan: models."""
