"""pipeplan: pipeplan."""
