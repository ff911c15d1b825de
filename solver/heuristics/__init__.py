"""Searches without proofs: group-search and NSGA-II."""
