"""host-sync in the nested-tensor fast path of torch's transformer layers.

`nn.TransformerEncoder` in eval mode with a `src_key_padding_mask` checks that the mask is left-aligned
(`torch._nested_tensor_from_mask_left_aligned`, a bool the host reads) and packs the batch into a nested
tensor (`torch._nested_tensor_from_mask`: ATen compares the per-row lengths on the device, then copies
them to the host to size the result). Both are single C++ ops, so nothing inside them dispatches: the
rule is keyed by the ops themselves. The finding names the target's line that ran the layer.
"""

from __future__ import annotations

from audit.detectors.host_sync import sync_op

_FIX = ("Build the encoder with `enable_nested_tensor=False, mask_check=False` (the padded path keeps one shape "
        "and reads nothing back), or apply the padding mask as an attention mask yourself.")


@sync_op("aten._nested_tensor_from_mask", "aten._nested_tensor_from_mask_left_aligned")
def nested_from_mask(rec):
    """The padding mask's row lengths are read from the device (to check the mask, or to size the
    nested result)."""
    what = "checks the padding mask on the host" if rec.op.endswith("left_aligned") else \
        "copies the padding mask's row lengths to the host to size the nested tensor"
    return (f"`{rec.op}` (the nested-tensor fast path of nn.TransformerEncoder) {what}, which waits for "
            "the device", _FIX)
