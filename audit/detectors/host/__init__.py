"""Host memory: which tensors live on the host on purpose, how a class or a helper made them,
and the host work a graph never records. The host-sync, host-data, baked and pageable-copy
rules share these answers.
"""
