"""pipeplan: runtime. Runs a ``pipeplan.plan/1`` on real processes with torch.distributed.

One idea per module:

- :mod:`runtime.routing`   which samples each rank handles; which messages cross each cut
- :mod:`runtime.stage`     a stage built from the zoo model's units; boundary buffer layout
- :mod:`runtime.transport` point-to-point messages: rank-driven TCP sockets, or torch.distributed
- :mod:`runtime.comm`      activations and gradients between neighbouring stages
- :mod:`runtime.gradsync`  gradient all-reduce of replicas and of tied weights
- :mod:`runtime.executor`  one rank's op list, timed
- :mod:`runtime.emulate`   ``--emulate``: device speeds and link delays of the cluster
- :mod:`runtime.memory`    peak memory per rank
- :mod:`runtime.measure`   measured timelines: iteration times, Chrome trace, Gantt chart
- :mod:`runtime.verify`    one-process reference training and the difference to it
- :mod:`runtime.checks`    inputs cross-checked before any process starts
- :mod:`runtime.heartbeat` worker liveness for the launcher
- :mod:`runtime.launch`    local processes on loopback, watched and cleaned up
- :mod:`runtime.worker`    the per-rank entry point (also under ``torchrun``)
- :mod:`runtime.replay`    the spec's timeline on the measured op times
- :mod:`runtime.report`    what ``pipeplan run`` prints and writes
"""
