"""Serving helpers: a timing decorator that keeps per-name latencies in a module global, and a
sampler that reseeds its per-request generator on every call (the hazards), with safe twins."""

import time

import torch

TIMINGS = {}


def timed(name):
    def deco(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            TIMINGS.setdefault(name, []).append(time.perf_counter() - t0)  # HAZARD: cpu-side-effect
            return out

        return wrapper

    return deco


def untimed(name):
    return lambda fn: fn


class SeededSampler:
    def __init__(self, device, seed: int = 1234):
        self.generator = torch.Generator(device=device)
        self.seed = seed

    def __call__(self, probs):
        self.generator.manual_seed(self.seed)  # HAZARD: rng
        return torch.multinomial(probs, 1, generator=self.generator)  # HAZARD: rng


class GreedySampler:
    def __call__(self, probs):
        return torch.argmax(probs, -1, keepdim=True)
