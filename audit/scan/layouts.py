"""The shape and strides the tracer records for a tensor of any layout (its `TensorMeta`).

A strided-layout nested tensor (`torch.nested.nested_tensor(list(values.split(lens)))`, a jagged batch
padded with `to_padded_tensor`) has no sizes: `t.shape` raises ("NestedTensorImpl doesn't support
sizes"), and `t.stride()` raises on it as on sparse CSR/CSC/BSR tensors. Recording an op on one must not
stop the target's step, so each ragged dimension is recorded as -1 and missing strides as (). A jagged-layout
one (`torch.nested.nested_tensor_from_jagged(values, offsets)`) has sizes, but its ragged dimension is a
symbolic "nested int", a new one for each offsets tensor: not a launch size, and no shape that changes
between steps, so it is recorded as -1 too.

A sparse COO tensor also says whether it is coalesced (its third element): a GPU's sparse matmul kernels
coalesce an uncoalesced operand first, which reads the merged nnz back (audit/detectors/sparse_sizes.py).
"""

from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["COO", "COO_COALESCED", "shape_stride"]

COO, COO_COALESCED = "coo", "coo-coalesced"


def _coo(t) -> str:
    with _disable_current_modes():  # is_coalesced() is a dispatched op: not one of the step's
        return COO_COALESCED if t.is_coalesced() else COO


def _size(t, d: int) -> int:
    try:
        return t.size(d)
    except RuntimeError:  # a ragged dimension of a nested tensor
        return -1


def shape_stride(t) -> tuple:
    """(shape, stride, sparse) of `t`, sparse "" unless a COO tensor (COO or COO_COALESCED); never raises for a
    tensor whose layout lacks one of them. Called for every tensor of every traced op: a plain tensor returns at
    once, only a nested one is walked."""
    if not t.is_nested:
        try:
            return t.shape, t.stride(), _coo(t) if t.is_sparse else ""
        except RuntimeError:  # sparse CSR/CSC/BSR tensors have no strides
            return t.shape, (), ""
    try:
        shape = t.shape
    except RuntimeError:
        shape = tuple(_size(t, d) for d in range(t.dim()))
    else:
        if not all(type(n) is int for n in shape):  # a jagged-layout nested tensor: its ragged dim is a SymInt
            shape = tuple(n if type(n) is int else -1 for n in shape)
    try:
        stride = t.stride()
    except RuntimeError:
        stride = ()
    if not all(type(n) is int for n in stride):
        stride = tuple(n if type(n) is int else -1 for n in stride)
    return shape, stride, ""
