"""What pyproject.toml cannot say: minidnn's packages, found, plus the top-level models/
folder installed as the package minidnn.models (one file per network family)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["minidnn", "minidnn.*"]) + ["minidnn.models"],
      package_dir={"minidnn.models": "models"})
