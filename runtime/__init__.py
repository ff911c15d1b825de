"""pipeplan: runtime. Runs a ``pipeplan.plan/1`` on real processes with torch.distributed.

One idea per module:

- :mod:`pipeplan.runtime.routing`   which samples each rank handles; which messages cross each cut
- :mod:`pipeplan.runtime.stage`     a stage built from the zoo model's units; boundary buffer layout
- :mod:`pipeplan.runtime.transport` point-to-point messages: rank-driven TCP sockets, or torch.distributed
- :mod:`pipeplan.runtime.comm`      activations and gradients between neighbouring stages
- :mod:`pipeplan.runtime.gradsync`  gradient all-reduce of replicas and of tied weights
- :mod:`pipeplan.runtime.executor`  one rank's op list, timed
- :mod:`pipeplan.runtime.emulate`   ``--emulate``: device speeds and link delays of the cluster
- :mod:`pipeplan.runtime.memory`    peak memory per rank
- :mod:`pipeplan.runtime.measure`   measured timelines: iteration times, Chrome trace, Gantt chart
- :mod:`pipeplan.runtime.verify`    one-process reference training and the difference to it
- :mod:`pipeplan.runtime.checks`    inputs cross-checked before any process starts
- :mod:`pipeplan.runtime.heartbeat` worker liveness for the launcher
- :mod:`pipeplan.runtime.launch`    local processes on loopback, watched and cleaned up
- :mod:`pipeplan.runtime.worker`    the per-rank entry point (also under ``torchrun``)
- :mod:`pipeplan.runtime.replay`    the spec's timeline on the measured op times
- :mod:`pipeplan.runtime.report`    what ``pipeplan run`` prints and writes
"""
