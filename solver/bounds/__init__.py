"""Proved lower bounds on the iteration time, and proofs that no plan fits."""
