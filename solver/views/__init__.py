"""Pictures and traces of a simulated plan: Gantt charts, Perfetto traces, figure writing."""
