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


@pytest.fixture
def one_thread():
    """torch on one thread for the test: the tiny models run fastest so, where two threads spin-wait against each
    other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
