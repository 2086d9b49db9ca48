"""Counting kernels: nodes of a captured cudaGraph_t against CUDA kernels of a profiled eager run.

A kernel launched on a stream that is not capturing (a cached stream in an external library, a
stream of another device) runs eagerly during capture and is not a graph node: replay silently
skips it. Nothing raises (measured on an H200, docs/hazards.md), so counting is the only mechanical check.

Graph side: `torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()` and
`cuda.bindings.runtime.cudaGraphGetNodes` / `cudaGraphNodeGetType` (old cuda-python: `cuda.cudart`),
descending into child-graph nodes. Eager side: torch.profiler with CUDA activity; kernels are the
device events that are neither memcpy/memset nor user annotations.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["graph_kernel_counts", "count_eager_kernels", "runtime_bindings"]


def runtime_bindings():
    """The CUDA runtime Python bindings: cuda.bindings.runtime (cuda-python >= 12.6) or cuda.cudart."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt  # type: ignore[no-redef]
        except ImportError as e:
            raise RuntimeError("cuda-python is not installed (pip install cuda-bindings): "
                               "graph nodes cannot be counted") from e
    return rt


def _check(rt, result, what: str):
    """(err, *outs) -> outs; raises with the CUDA error name on failure."""
    if not isinstance(result, tuple):
        result = (result,)
    err, *out = result
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)}")
    return out[0] if len(out) == 1 else tuple(out)


def _type_name(t) -> str:
    name = getattr(t, "name", None) or str(t)
    name = name.split(".")[-1]
    return name.replace("cudaGraphNodeType", "").lower() or str(int(t))


def _graph_handle(rt, raw):
    """cuda.bindings accepts the int from raw_cuda_graph(); older cudart wants a cudaGraph_t."""
    if isinstance(raw, int) and hasattr(rt, "cudaGraph_t"):
        try:
            return rt.cudaGraph_t(init_value=raw)
        except TypeError:
            return raw
    return raw


def graph_kernel_counts(raw_graph, _depth: int = 0) -> dict:
    """{"nodes": all nodes, "kernels": kernel nodes, "types": {type: count}} of a cudaGraph_t."""
    rt = runtime_bindings()
    graph = _graph_handle(rt, raw_graph)
    out = _check(rt, rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
    n = out[-1] if isinstance(out, tuple) else out
    n = int(n)
    types: Counter = Counter()
    kernels = nodes = 0
    if n:
        nodes_list, n = _check(rt, rt.cudaGraphGetNodes(graph, n), "cudaGraphGetNodes")
        kernel_t = rt.cudaGraphNodeType.cudaGraphNodeTypeKernel
        child_t = rt.cudaGraphNodeType.cudaGraphNodeTypeGraph
        for node in list(nodes_list)[: int(n)]:
            t = _check(rt, rt.cudaGraphNodeGetType(node), "cudaGraphNodeGetType")
            nodes += 1
            types[_type_name(t)] += 1
            if t == kernel_t:
                kernels += 1
            elif t == child_t and _depth < 8:
                child = _check(rt, rt.cudaGraphChildGraphNodeGetGraph(node), "cudaGraphChildGraphNodeGetGraph")
                sub = graph_kernel_counts(child, _depth + 1)
                kernels += sub["kernels"]
                nodes += sub["nodes"]
                types.update(sub["types"])
    return {"nodes": nodes, "kernels": kernels, "types": dict(types)}


def _is_memop(event) -> bool:
    name = str(getattr(event, "name", "") or "")
    kind = str(getattr(event, "activity_type", "") or "").lower()
    return name.startswith(("Memcpy", "Memset", "memcpy", "memset")) or "memcpy" in kind or "memset" in kind


def count_eager_kernels(fn, sync) -> tuple[int, int]:
    """(kernels, memcpy+memset) that one eager call of fn issues, on any stream of any device.

    Runs on the caller's current stream (the capture stream); `sync` waits for every device
    involved so that CUPTI has seen each kernel before the profiler stops.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    kernels = memops = 0
    for e in prof.events():
        if getattr(e, "device_type", None) != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        if _is_memop(e):
            memops += 1
        else:
            kernels += 1
    return kernels, memops
