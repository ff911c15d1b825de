"""pipeplan.solver: plans, what they cost, and the solvers that find and prove them.

The package map, lowest layer first (a module imports only from its own layer or lower
ones; ``tests/test_imports.py`` holds this):

=============  ==========================================================================
sub-package    holds
=============  ==========================================================================
schedules      schedules as classes looked up by name (``schedule_for``): what each
               needs of a plan, the programs it generates and their checks; actions
               (``"2I3"``) and torch's CSV format
formats        what files hold: clusters (and the catalog and units they are built
               from), plans
evaluation     what a plan costs: the exact simulator (spec sections 4, 5 and 7), its
               batched numpy form and the memory model
views          Gantt charts, Perfetto traces and figure writing
core           the contract: the frozen ``PlanningProblem``, the ``Solver`` base class
               (``algorithm``), the ``SolverResult`` record, stopping rules
               (``termination``), warm starts
space          what a stage or a device group can run on: device classes, stage
               options, arcs (candidate stages), placements, the virtual-stage space
bounds         proved lower bounds (per-term, class-level, virtual-stage, path floor) and
               proofs that no plan fits
exact          the exact solvers: the candidate table, the bound model, the enumeration,
               the phases around the model, the ILP (``ilp.py``), the CP-SAT model
               (``cpsat.py``), ``virtual-bnb`` (``virtual_search.py``) and the version-2
               model it solves for its bound (``virtual_model.py``)
baselines      the published planners, each in one module
heuristics     searches without proofs: group-search and NSGA-II
splits         unequal and per-stage microbatch splits: the CP-SAT split model and the
               joint search
portfolio      which searches the composite solvers run inside their own (the exact
               solvers' phases, nsga's seeds, virtual-bnb's start), with their budgets
solvers        the registered solvers: name -> search space -> algorithm, one table
planning       planning as a library: a solver over one schedule or several, solvers
               compared, why no plan came back (``pipeplan.plan``, ``pipeplan.compare``)
=============  ==========================================================================
"""
