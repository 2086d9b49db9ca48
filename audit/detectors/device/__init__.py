"""Which side of a device test a GPU takes, and which code a capture never runs. A CPU scan
sees the CPU's side; these decide what the GPU's side would do.
"""
