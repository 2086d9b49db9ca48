"""The hf: driver hands the cache under the name the model's generation inputs use.

transformers names the cache argument differently by model and version: `cache` (5.2x),
`cache_params` (Mamba-style state-space models before that, which generate passes it as) and
`past_key_values` (the rest). A driver that always said `past_key_values` left a Mamba forward with
no cache at all, and transformers' generic input preparation turned the 2D mask into a dict that
the model then indexed: the factory raised before a single step. No transformers needed here: the
models are stand-ins with the same signatures."""

from __future__ import annotations

import itertools
import random

import pytest

from audit.target_hf import CACHE_NAMES, cache_kwarg


def _model(prepare_params: list[str], forward_params: list[str]):
    """A stand-in model whose prepare_inputs_for_generation and forward take the given parameters."""
    ns: dict = {}
    exec(f"def prepare_inputs_for_generation(self, input_ids, {', '.join(prepare_params + ['**kwargs'])}): pass\n"
         f"def forward(self, input_ids=None, {', '.join(forward_params + ['**kwargs'])}): pass", ns)
    return type(f"Model{random.randrange(10**6)}", (), ns)()


def _extras(k: int) -> list[str]:
    """k other parameters, of names no other call repeats."""
    return [f"{random.choice(['inputs_embeds', 'use_cache', 'attention_mask', 'position_ids'])}_{next(_SERIAL)}=None"
            for _ in range(k)]


_SERIAL = itertools.count()


@pytest.mark.parametrize("name", list(CACHE_NAMES))
def test_the_cache_goes_under_the_name_prepare_inputs_names(name):
    params = _extras(random.randrange(3)) + [f"{name}=None"] + _extras(random.randrange(3))
    assert cache_kwarg(_model(params, _extras(2))) == name


def test_a_generic_prepare_defers_to_the_forward_signature():
    model = _model(_extras(random.randrange(3)), _extras(random.randrange(2)) + ["cache_params=None"])
    assert cache_kwarg(model) == "cache_params"  # a state-space forward behind the generic prepare


def test_past_key_values_when_no_name_is_known():
    assert cache_kwarg(_model(_extras(2), _extras(2))) == "past_key_values"
