"""The embedded-default tests use tiny tensors: one intra-op thread is faster, and far faster when
the machine is shared (two spinning threads on an oversubscribed 2-core box ran ~6x slower)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
