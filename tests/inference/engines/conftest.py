from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inference.engines.base import PROJECT_ROOT

BUILD_SCRIPT = PROJECT_ROOT / "fixtures" / "build_tiny_models.py"


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    # fixtures/ is not a package: load the build script from its path.
    spec = importlib.util.spec_from_file_location("build_tiny_models", BUILD_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_models()
