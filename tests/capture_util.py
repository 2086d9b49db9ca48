"""Shared by the capture tests: a failure raised from user-level code, as a module's forward would."""


def _user_level_failure():
    raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
                       "tensor is pinned")
