"""The profilers, run as ``glm-grpo profile TOOL [args]`` (tools.py lists them): what a GRPO step, a decode step and
the DiT decode cost, measured. Not part of the product: the training path and the other commands never import
from here (tests/unit/test_boundaries.py)."""
