"""Package layout that pyproject.toml cannot express: formulas/ ships as nbgrad/formulas/."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["nbgrad", "nbgrad.*"]), "nbgrad.formulas"],
    package_dir={"nbgrad.formulas": "formulas"},
    package_data={"nbgrad.formulas": ["*.yaml"]},
)
