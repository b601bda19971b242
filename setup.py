"""Maps the design card's top-level folders into the one `edgeinspect` namespace.

pyproject.toml holds all metadata; only the package list lives here, because it is derived from the folders
(a static list would silently drop a new subpackage from the wheel).
"""

from setuptools import find_packages, setup

PACKAGE_ROOTS = {
    "edgeinspect": "edgeinspect",
    "edgeinspect.models": "models",
    "edgeinspect.services": "services",
    "edgeinspect.rag": "rag",
}

packages = []
for namespace, folder in PACKAGE_ROOTS.items():
    packages.append(namespace)
    packages += [f"{namespace}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=PACKAGE_ROOTS)
