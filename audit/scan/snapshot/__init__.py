"""Python state around each audited step: what the target can reach (modules, objects, classes, TorchScript and
subclass internals, host generators, staging bytes), fingerprinted so the side-effect and stale-pointer rules can
tell what a step changed.
"""
