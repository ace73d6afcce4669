"""Package layout that pyproject.toml cannot express: formulas/ ships as nbgrad/formulas/.

The checkout's root ``__init__.py`` is not a package of the distribution (only for
``import nbgrad`` run in the folder that holds the clone; see that file)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["nbgrad", "nbgrad.*"]), "nbgrad.formulas"],
    package_dir={"nbgrad.formulas": "formulas"},
    package_data={"nbgrad.formulas": ["*.yaml"]},
)
