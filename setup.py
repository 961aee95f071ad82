"""Packaging that pyproject.toml cannot say: the top-level folders mapped into the package.

``method_configs/`` (the method and dataparser specifications ``ns-train`` finds through entry points) is installed
as ``odin_nerfstudio.method_configs``, so a wheel holds no bare top-level package named ``method_configs`` that could
collide with another project's in site-packages.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["odin_nerfstudio", "odin_nerfstudio.*"]) + ["odin_nerfstudio.method_configs"],
    package_dir={"odin_nerfstudio.method_configs": "method_configs"},
)
