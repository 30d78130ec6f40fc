"""How a model's outputs are judged against a reference: shared by the converters and the device agent.

numpy only, so the agent's install stays light (docs/architecture.md, tests/unit/test_layering.py).
"""
