"""``edgesdk fleet serve``: the long-running fleet service (host side; never imports the agent).

It connects to the broker, ingests what devices publish into a database (``ingest``), and
owns rollouts: the rollout controller of :mod:`edgesdk.fleet.rollout` runs here over the
service's SQLAlchemy store (``store``), so a deployment outlives the operator's terminal and a
service killed at any step resumes it on restart. ``schema`` is the one description of the
tables, ``migrations`` the Alembic scripts run at start-up (``database.migrate``), ``retention``
the per-minute downsampling, ``service`` the process that wires them. See docs/fleet-service.md.
"""
