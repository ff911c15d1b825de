"""Unequal and per-stage microbatch splits: the CP-SAT split model and the joint search."""
