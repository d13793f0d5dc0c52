import os

import pytest
import torch
from hypothesis import settings

# CI: a fixed, reproducible set of examples; locally: more of them, freshly drawn each run.
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=40, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
