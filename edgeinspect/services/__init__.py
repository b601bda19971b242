"""The roles (gateway, stage, vision, retrieval, ingest, console...) and their shared wire pieces: edgeinspect.services.

The folder sits at the repository root, so from there `import services` would find it too and load every module a
second time under another name (two Prometheus registries' worth of families, two copies of every class).
"""

if __name__ != "edgeinspect.services":
    raise ImportError(f"import edgeinspect.services, not {__name__}: edgeinspect is the one import name")
