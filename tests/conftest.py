"""Every test gets a cutetune cache folder of its own (libraries, templates, kernels), so none
reads what another built, nor fills the user's ~/.cache."""

import pytest


@pytest.fixture(autouse=True)
def _own_cutetune_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path_factory.mktemp("cutetune-cache")))
