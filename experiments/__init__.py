"""pipeplan: experiments."""
