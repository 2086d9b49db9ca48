"""Planted (multi-GPU): a clean model; the test captures it on a stream of ANOTHER device."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_common import Target  # noqa: E402


def make(device):
    return Target(device, None)
