"""Shared fixtures: a fresh seed per test (printed, so a failure can be replayed) and GPU skipping."""

from __future__ import annotations

import os
import random

import pytest
import torch


@pytest.fixture
def seed(request) -> int:
    """Fresh random seed every run; OSCAR_TEST_SEED replays one."""
    value = int(os.environ.get("OSCAR_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(value)
    print(f"[seed] {request.node.nodeid}: OSCAR_TEST_SEED={value}")
    return value


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
