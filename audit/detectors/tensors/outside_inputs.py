"""Whether a varying input that came from outside the step starts the variation, or only stands in for a step-made one.

dynamic-shape is reported where a variation starts, and an input read from outside the step whose shape varies is
such a start (`prepare()` rebinding the input to a longer tensor). A helper that returns its table untouched when it
already has the wanted size, and a resampled copy otherwise (timm's `resample_abs_pos_embed` under
`dynamic_img_size`: a frame whose patch grid is the model's own gets `self.pos_embed` back), hands the next op a
parameter in those steps and a tensor the step made in the others. That operand came from outside the step in some
steps, yet the parameter's shape never changes: the variation comes from the step-made arm, which follows the
image's grid and is reported upstream. So a varying input counts as read from outside only when it was in every
step, or when its outside reads themselves take more than one shape.
"""

from __future__ import annotations

__all__ = ["outside_varies"]


def outside_varies(recs, varying) -> bool:
    """Some varying input position of the aligned calls `recs` came from outside the step in every record, or
    took at least two shapes across the records where it came from outside."""
    for j in varying:
        outside = [r for r in recs if j < len(r.in_step) and not r.in_step[j]]
        if not outside:
            continue
        if len(outside) == len(recs) or len({tuple(r.inputs[j].shape) for r in outside}) > 1:
            return True
    return False
