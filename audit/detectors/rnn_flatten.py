"""step-allocation: an RNN's weights re-packed in the step (`self.lstm.flatten_parameters()` in forward).

The habit comes from DataParallel and Tacotron-style code: flatten at the top of every forward to silence
the "weights are not part of single contiguous chunk" warning. With cuDNN each call allocates a new flat
weight buffer, copies the weights into it and re-points every parameter at it. Under capture that buffer
comes from the graph's pool and the parameters keep pointing into it after the capture; the captured copy
reads the buffer the parameters held before, which the capture freed. Each replay then refills the
weights from memory the allocator has handed to other tensors: the parameters escaped into the graph and
are rewritten with whatever lies there. A CPU scan sees nothing (the call is a no-op on CPU weights), so
the calls are recorded where they are made (audit/scan/patches/rnn_flatten.py).
"""

from __future__ import annotations

from audit.detectors import register
from audit.scan.patches.rnn_flatten import KIND

FIX = ("Call `flatten_parameters()` once, after the module is moved to the GPU (in make(), or let `.to(device)` "
       "do it), not in forward; the weights stay flat until they are moved again.")


@register("step-allocation")
def weights_repacked(ctx):
    """`flatten_parameters()` of a cuDNN-eligible RNN called inside the step, one finding per calling line."""
    recs = [r for r in ctx.all_records((KIND,)) if r.stack]
    out = []
    for (_, _, op, _), group in ctx.per_site(recs).items():
        owner = group[0].note or "an RNN"
        msg = (f"`{owner}.flatten_parameters()` in the step: with cuDNN it allocates a new weight buffer every call, "
               "copies the weights in and re-points the parameters at it; under capture the parameters end up "
               "in the graph's pool and each replay refills them from the buffer they held before, freed at capture")
        out.append(ctx.finding("step-allocation", group[0], op, len(group) / ctx.n_steps, msg,
                               severity="silent-corruption", fix=FIX))
    return out
