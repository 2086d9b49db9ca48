"""The shape and strides the tracer records for a tensor of any layout (its `TensorMeta`).

A strided-layout nested tensor (`torch.nested.nested_tensor(list(values.split(lens)))`, a jagged batch
padded with `to_padded_tensor`) has no sizes: `t.shape` raises ("NestedTensorImpl doesn't support
sizes"), and `t.stride()` raises on it as on sparse CSR/CSC/BSR tensors. Recording an op on one must not
stop the target's step, so each ragged dimension is recorded as -1 and missing strides as ().
"""

__all__ = ["shape_stride"]


def _size(t, d: int) -> int:
    try:
        return t.size(d)
    except RuntimeError:  # a ragged dimension of a nested tensor
        return -1


def shape_stride(t) -> tuple:
    """(shape, stride) of `t`; never raises for a tensor whose layout lacks one of them."""
    try:
        shape = t.shape
    except RuntimeError:
        shape = tuple(_size(t, d) for d in range(t.dim()))
    try:
        stride = t.stride()
    except RuntimeError:
        stride = ()
    return shape, stride
