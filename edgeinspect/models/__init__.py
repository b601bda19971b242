"""Checkpoints, the split decoder, quantisation, the planner and the accelerator backends: edgeinspect.models.

The folder sits at the repository root, so from there `import models` would find it too and load every module a
second time under another name.
"""

if __name__ != "edgeinspect.models":
    raise ImportError(f"import edgeinspect.models, not {__name__}: edgeinspect is the one import name")
