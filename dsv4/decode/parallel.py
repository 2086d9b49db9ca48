"""Tensor-parallel decode: `shard_` edits a loaded model in place so that each rank holds its slice.

The split (Megatron-style, two all-reduces per layer, as the released inference code does it):
- Attention: the heads are split by whole o_groups. Rank r keeps wq_b's rows of its heads, the
  attn_sink of its heads, wo_a's rows of its groups (wo_a is block-diagonal per group, so nothing
  crosses ranks between the queries and wo_a) and wo_b's columns of its groups. Its wo_b product
  is then a partial sum over groups, which the Attention's `reduce` hook sums over the ranks.
  wq_a, the one shared K=V head (wkv), the compressors and the indexer are small and replicated:
  every rank keeps the same caches and no collective sits inside the attention itself.
- MoE: the routed experts are split in contiguous ranges (expert parallel). The gate is
  replicated, so every rank routes alike; a rank runs its own experts for the tokens routed to
  them and contributes zero for the rest. The shared expert is split along its intermediate dim
  (w1/w3 rows, w2 columns) when each share is a multiple of 128 (the FP8 blocks: Flash and Pro up
  to 16 ranks); otherwise (tiny's 128-wide one) it stays whole on rank layer_id % world. The MoE's
  `reduce` hook sums the ranks' partial FFN outputs.
Both sums run on fp32 [B, T, dim] before the cast to the activation dtype, so the result is
rounded once, as in the unsharded model; only the fp32 summation order differs (tests hold float32
logits to 1e-5 relative of the unsharded model).

CUDA graphs: `dist.all_reduce` enqueues on the current stream, so under NCCL it is captured into
the graph like any kernel: CUDAGraphDecoder's `full` mode holds every layer's two collectives
inside each rank's one graph (`ab` mode: inside graph B). The warmup runs before capture create the
NCCL communicator; every rank must then replay the same graphs in the same order.

dsv4/model.py knows nothing of this: Attention and MoE call an optional `reduce` (identity by
default), and MoE walks `expert_ids`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dsv4.config import ModelConfig
from dsv4.decode.tp_slice import alignment, slice_linear_
from dsv4.errors import DSV4Error
from dsv4.layers.attention import Attention
from dsv4.layers.moe import MoE
from dsv4.model import Transformer

__all__ = ["AllReduce", "DistEnv", "LocalExperts", "Shard", "check_world", "dist_env", "held_bytes",
           "init_distributed", "shard_", "shutdown_distributed"]


@dataclass(frozen=True)
class Shard:
    """What rank `rank` of `world` holds (global indices)."""

    rank: int
    world: int
    heads: range
    groups: range
    experts: range
    shared_split: bool  # False: each layer's shared expert lives whole on rank layer_id % world


class AllReduce:
    """The `reduce` hook of a sharded layer: in-place sum over the group, on the current stream."""

    def __init__(self, group=None):
        self.group = group

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        return t

    def __repr__(self) -> str:
        return "AllReduce(sum)"


class LocalExperts(nn.Module):
    """The routed experts one rank holds, under their global ids: state_dict keys stay the released
    `ffn.experts.{e}.*` (a subset of them), and `experts[e]` takes a global id."""

    def __init__(self, experts: dict[int, nn.Module]):
        super().__init__()
        for e in sorted(experts):
            self.add_module(str(e), experts[e])

    def __getitem__(self, e: int) -> nn.Module:
        return self._modules[str(e)]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


# ---------------------------------------------------------------------- planning
def _share(n: int, rank: int, world: int) -> range:
    per = n // world
    return range(rank * per, (rank + 1) * per)


def shared_split(cfg: ModelConfig, world: int) -> bool:
    """Whether the shared expert's intermediate dim splits into whole scale/activation blocks."""
    inter = cfg.moe_inter_dim * cfg.n_shared_experts
    rows, cols = (alignment(cfg.weight_fmt, d, cfg.simulate_quant) for d in (0, 1))
    return inter % world == 0 and (inter // world) % rows == 0 and (inter // world) % cols == 0


def check_world(cfg: ModelConfig, world: int) -> None:
    """One-line DSV4Error unless `world` ranks can each take whole groups, experts and FP8 blocks."""
    if not isinstance(world, int) or world < 1:
        raise DSV4Error(f"tensor parallel: the world size must be a positive integer, not {world!r}")
    if cfg.o_groups % world:
        raise DSV4Error(f"tensor parallel over {world} ranks: o_groups={cfg.o_groups} (n_heads={cfg.n_heads}) is not "
                        f"divisible by {world}; attention is split by whole output groups")
    if cfg.n_routed_experts % world:
        raise DSV4Error(f"tensor parallel over {world} ranks: n_routed_experts={cfg.n_routed_experts} is not "
                        f"divisible by {world}; each rank holds the same number of experts")
    rows, cols = (alignment(cfg.weight_fmt, d, cfg.simulate_quant) for d in (0, 1))
    for what, n, step in (("wq_b rows (heads x head_dim)", cfg.n_heads // world * cfg.head_dim, rows),
                          ("wo_a rows (groups x o_lora_rank)", cfg.o_groups // world * cfg.o_lora_rank, rows),
                          ("wo_b columns (groups x o_lora_rank)", cfg.o_groups // world * cfg.o_lora_rank, cols)):
        if n % step:
            raise DSV4Error(f"tensor parallel over {world} ranks: each rank's {what} would be {n}, not a multiple "
                            f"of the {step}-wide {cfg.weight_fmt} blocks")


def plan(cfg: ModelConfig, rank: int, world: int) -> Shard:
    check_world(cfg, world)
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise DSV4Error(f"tensor parallel: rank {rank!r} is outside [0, {world})")
    return Shard(rank, world, _share(cfg.n_heads, rank, world), _share(cfg.o_groups, rank, world),
                 _share(cfg.n_routed_experts, rank, world), shared_split(cfg, world))


# ---------------------------------------------------------------------- sharding
def shard_(model: Transformer, rank: int, world: int, reduce=None) -> Shard:
    """Keeps rank `rank`'s slice of every block (MTP included) and frees the rest; returns the plan.

    reduce: the sum over ranks (default: all_reduce over the default process group, which must
    be initialised when world > 1). Shard before building a StaticDecoder or CUDAGraphDecoder:
    their expert banks are stacked from the experts the model holds at that time."""
    if getattr(model, "tp", None) is not None:
        raise DSV4Error(f"the model is already sharded (rank {model.tp.rank} of {model.tp.world})")
    shard = plan(model.cfg, rank, world)
    if world > 1:
        reduce = reduce or AllReduce()
        for prefix, block in [(f"layers.{i}", b) for i, b in enumerate(model.layers)] + \
                             [(f"mtp.{i}", b) for i, b in enumerate(model.mtp)]:
            _shard_attention(block.attn, shard, reduce, f"{prefix}.attn")
            _shard_moe(block.ffn, shard, block.layer_id, reduce, f"{prefix}.ffn")
    model.tp = shard
    return shard


def _shard_attention(attn: Attention, s: Shard, reduce, name: str) -> None:
    D, o = attn.head_dim, attn.cfg.o_lora_rank
    h, g = s.heads, s.groups
    slice_linear_(attn.wq_b, 0, h.start * D, h.stop * D, f"{name}.wq_b")
    slice_linear_(attn.wo_a, 0, g.start * o, g.stop * o, f"{name}.wo_a")
    slice_linear_(attn.wo_b, 1, g.start * o, g.stop * o, f"{name}.wo_b")
    attn.attn_sink = nn.Parameter(attn.attn_sink.data[h.start:h.stop].clone(), requires_grad=False)
    attn.n_heads, attn.groups = len(h), len(g)
    attn.reduce = reduce


def _shard_moe(moe: MoE, s: Shard, layer_id: int, reduce, name: str) -> None:
    moe.experts = LocalExperts({e: moe.experts[e] for e in s.experts})
    moe.expert_ids = s.experts
    shared = moe.shared_experts
    if s.shared_split:
        inter = shared.w1.out_features
        lo, hi = s.rank * inter // s.world, (s.rank + 1) * inter // s.world
        for w in ("w1", "w3"):
            slice_linear_(getattr(shared, w), 0, lo, hi, f"{name}.shared_experts.{w}")
        slice_linear_(shared.w2, 1, lo, hi, f"{name}.shared_experts.w2")
    elif layer_id % s.world != s.rank:
        moe.shared_experts = None
    moe.reduce = reduce


def held_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages behind the parameters and buffers: what the rank really holds."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


# ---------------------------------------------------------------------- process group
@dataclass(frozen=True)
class DistEnv:
    """This process's place in a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK); 0 of 1 without one."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0


def dist_env() -> DistEnv:
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise DSV4Error("RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)") from None
    if not 0 <= rank < world:
        raise DSV4Error(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    return DistEnv(rank, world, local)


def rank_device(env: DistEnv, device: str | None = None) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is there (or asked for without an index), else the CPU."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DSV4Error("device cuda requested but CUDA is not available")
        dev = torch.device("cuda", env.local_rank if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    return dev


def init_distributed(env: DistEnv, device: torch.device, timeout_s: float = 300.0) -> None:
    """The default process group: NCCL for CUDA, gloo for the CPU. Rendezvous is torchrun's
    (env://: MASTER_ADDR/MASTER_PORT) unless DIST_INIT_METHOD names another (the CPU tests use a
    file:// store, so no TCP store is opened)."""
    if env.world == 1 or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=os.environ.get("DIST_INIT_METHOD") or "env://", rank=env.rank,
                            world_size=env.world, timeout=timedelta(seconds=timeout_s))


def shutdown_distributed() -> None:
    """Barrier, then destroy the default group: no rank tears its connections down while a peer
    still talks to it (gloo aborts the peer with `terminate called without an active exception`)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
