"""The contract every solver shares: the frozen problem, the result record, stopping rules, the registry."""
