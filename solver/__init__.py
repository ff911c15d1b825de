"""pipeplan: solver."""
