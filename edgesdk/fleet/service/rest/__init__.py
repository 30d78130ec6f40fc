"""The fleet service's REST API for operators (FastAPI): ``app`` makes the app and its token
check; each other module is one part of it (its routes as a table, its handlers, its bodies):
``devices``, ``deployments``, ``admin`` (bundles, enrollment, tokens, audit), ``targeting``,
``webhooks``; ``routing`` registers the tables, ``schemas`` and ``problems`` are the answers'
shapes, ``server`` runs the app in a thread of the service."""
