"""pipeplan: runtime."""
