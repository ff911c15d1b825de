"""What a plan costs: the exact simulator (scalar and batched) and the memory model."""
