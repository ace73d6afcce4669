"""The second half of the CI fuzz seed blocks (see ``tests/test_fuzz.py``, which runs the
first): a file of its own so that another xdist worker runs it."""

from __future__ import annotations

import pytest
from test_fuzz import BLOCK, SEEDS, SPLIT, block_id, check_block


@pytest.mark.parametrize("first", range(SPLIT, SEEDS.stop, BLOCK), ids=block_id)
def test_fuzz_executors_agree(first):
    check_block(first)
