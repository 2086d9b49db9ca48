"""A machine without CUDA standing in for one: what a step written for the GPU calls (streams, events, graphs,
device queries, pinned memory, CPU-only kernels) answered on the host, so the CPU scan still runs it and still
sees what the GPU would do.
"""
