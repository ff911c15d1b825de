"""The exact solvers: the candidate table, the bound model, the enumeration, the ILP and the CP-SAT model."""
