"""Schedules as data: actions, the programs each named schedule generates, their checks and CSV."""
