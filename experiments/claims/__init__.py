"""The seed papers' claims, one module each; :data:`CLAIMS` lists them in report order.

Each module has ``run(settings) -> Section`` (see :mod:`.common`); ``pipeplan reproduce
--only NAME`` runs the claims by these names.
"""

CLAIMS = {
    "umpipe": "pipeplan.experiments.claims.umpipe",
    "autopipe": "pipeplan.experiments.claims.autopipe",
    "autopipe-h": "pipeplan.experiments.claims.autopipe_h",
    "hippie": "pipeplan.experiments.claims.hippie",
    "hetero-mix": "pipeplan.experiments.claims.hetero_mix",
    "exact": "pipeplan.experiments.claims.exact",
}
"""Claim name -> module, in the order the report shows them."""
