"""Real models that install offline, for examples, tests, benchmarks and the demo.

Each module needs the ``convert`` extra (torch) and scikit-learn; none is imported by
the agent.
"""
