"""Shadow agreement during probation (issue 41): a sampled share of live requests also runs on
the previous release, on one spare worker, and the new model's answers are judged against it.

``start_shadow`` (the updater's probation), ``ShadowCheck`` (the criterion), ``ShadowRunner``
(tap, sampler, bounded queue, worker), ``Agreement`` (per-output metrics and bounds),
``governor_pressure`` and ``attach`` (the agent's wiring). See docs/ota.md, "Shadow agreement".
Nothing is imported here: the daemon imports only the wiring at start, the rest loads with the
updater's first probation.
"""
