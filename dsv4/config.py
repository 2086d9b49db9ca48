"""ModelConfig: one dataclass for every DeepSeek-V4 size, read from either config.json dialect.

Field names follow the released inference code (`dim`, `n_layers`, ...); `from_dict` also accepts
the HF names (`hidden_size`, `num_hidden_layers`, ...). Runtime choices that are not part of a
checkpoint (numerics `dtype`, cache sizes) live here too so every module reads one object.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from dsv4.errors import DSV4Error

__all__ = ["ModelConfig", "PRESETS", "preset"]


@dataclass
class ModelConfig:
    vocab_size: int = 129280
    dim: int = 4096
    n_layers: int = 43
    n_mtp_layers: int = 1
    n_heads: int = 64
    head_dim: int = 512
    rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    n_activated_experts: int = 6
    moe_inter_dim: int = 2048
    score_func: str = "sqrtsoftplus"
    route_scale: float = 1.5
    n_hash_layers: int = 3
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    window_size: int = 128
    compress_ratios: list[int] = field(default_factory=lambda: [0, 0] + [4, 128] * 20 + [4, 0])
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    bos_token_id: int = 0  # the released tokenizer's <｜begin▁of▁sentence｜>
    eos_token_id: int | list[int] = 1  # <｜end▁of▁sentence｜>
    weight_fmt: str = "fp8"  # dense projections: "fp8" | "bf16" | "nvfp4"
    expert_fmt: str = "fp4"  # routed experts: "fp4" | "fp8" | "bf16" | "nvfp4"
    # runtime (not stored in a checkpoint)
    dtype: str = "bfloat16"  # "bfloat16": released numerics; "float32": exact math reference
    max_seq_len: int = 4096
    max_batch_size: int = 4

    def __post_init__(self) -> None:
        self.validate()

    # ----------------------------------------------------------------- derived
    @property
    def simulate_quant(self) -> bool:
        """bfloat16 mode reproduces the released FP8/FP4 activation and KV rounding."""
        return self.dtype == "bfloat16"

    @property
    def act_dtype(self):
        import torch

        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32

    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.rope_head_dim

    def ratio(self, layer_id: int) -> int:
        return self.compress_ratios[layer_id]

    def is_hash_layer(self, layer_id: int) -> bool:
        return layer_id < self.n_hash_layers

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        need = self.n_layers + self.n_mtp_layers
        if len(self.compress_ratios) < self.n_layers:
            raise DSV4Error(f"config: compress_ratios has {len(self.compress_ratios)} entries, need {need}")
        if len(self.compress_ratios) < need:  # MTP layers default to ratio 0
            self.compress_ratios = list(self.compress_ratios) + [0] * (need - len(self.compress_ratios))
        bad = sorted({r for r in self.compress_ratios if r not in (0, 4, 128)})
        if bad:
            raise DSV4Error(f"config: unsupported compress ratio(s) {bad}; DeepSeek-V4 uses 0, 4, 128")
        if self.dtype not in ("bfloat16", "float32"):
            raise DSV4Error(f"dtype must be 'bfloat16' or 'float32', not {self.dtype!r}")
        if self.n_heads % self.o_groups:
            raise DSV4Error("config: n_heads must be a multiple of o_groups")
        if self.max_seq_len > self.max_position_embeddings:
            self.max_seq_len = self.max_position_embeddings

    # -------------------------------------------------------------- (de)serialise
    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        """Reads the HF-style config (model_type deepseek_v4) or the inference-style one."""
        model_type = raw.get("model_type")
        if model_type is not None and model_type not in _MODEL_TYPES:
            raise DSV4Error(f"{source}: unknown model_type {model_type!r} (expected one of {sorted(_MODEL_TYPES)})")
        hf_style = any(k in raw for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "model_type"))
        kw: dict = {}
        for ours, hf in _HF_NAMES.items():
            key = hf if hf_style else ours
            if key in raw:
                kw[ours] = raw[key]
            elif ours in raw:
                kw[ours] = raw[ours]
        missing = [(_HF_NAMES[k] if hf_style else k) for k in _REQUIRED if k not in kw]
        if missing:
            raise DSV4Error(f"{source}: missing config field(s) {', '.join(missing)}")
        rs = raw.get("rope_scaling") or {}
        if rs:
            kw["rope_factor"] = rs.get("factor", kw.get("rope_factor", 16.0))
            kw["original_seq_len"] = rs.get("original_max_position_embeddings", 65536)
            kw["beta_fast"] = rs.get("beta_fast", 32)
            kw["beta_slow"] = rs.get("beta_slow", 1)
        if hf_style:
            kw["n_mtp_layers"] = raw.get("num_nextn_predict_layers", 1)
            qc = raw.get("quantization_config") or {}
            kw["weight_fmt"] = _quant_fmt(qc)
            kw["expert_fmt"] = raw.get("expert_dtype", "fp4" if qc else "bf16")
        else:
            # the inference config.json keeps YaRN (and our MTP count) as top-level fields
            for k in ("rope_factor", "original_seq_len", "beta_fast", "beta_slow", "n_mtp_layers"):
                if k in raw:
                    kw[k] = raw[k]
            kw["weight_fmt"] = {"fp8": "fp8", "bf16": "bf16", "nvfp4": "nvfp4"}.get(raw.get("dtype", "fp8"), "fp8")
            kw["expert_fmt"] = raw.get("expert_dtype", "fp4")
        _check_architecture(raw, source)
        if kw.get("num_key_value_heads", 1) != 1:
            raise DSV4Error(f"{source}: num_key_value_heads must be 1 (one shared K=V head)")
        kw.pop("num_key_value_heads", None)
        kw.setdefault("max_seq_len", min(4096, kw.get("max_position_embeddings", 4096)))
        return cls(**kw)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise DSV4Error(f"{path}: no config.json") from None
        except json.JSONDecodeError as e:
            raise DSV4Error(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw, source=str(path))

    def to_hf_dict(self) -> dict:
        """The HF-style config.json the released checkpoints ship."""
        out = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
        for ours, hf in _HF_NAMES.items():
            if ours in _RUNTIME:
                continue
            out[hf] = getattr(self, ours)
        out["num_key_value_heads"] = 1
        out["num_nextn_predict_layers"] = self.n_mtp_layers
        out.update(_ARCHITECTURE)
        out.update(_HF_DEFAULTS)
        out["rope_scaling"] = {
            "type": "yarn",
            "factor": self.rope_factor,
            "original_max_position_embeddings": self.original_seq_len,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
        }
        out["torch_dtype"] = "bfloat16"
        if self.weight_fmt == "fp8":
            out["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "weight_block_size": [128, 128],
                "scale_fmt": "ue8m0",
                "activation_scheme": "dynamic",
            }
        elif self.weight_fmt == "nvfp4":
            out["quantization_config"] = {"quant_method": "nvfp4", "group_size": 16}
        out["expert_dtype"] = self.expert_fmt
        return out


# ours -> HF name; fields absent here keep their inference-style name in both dialects
_HF_NAMES = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "rope_head_dim": "qk_rope_head_dim",
    "q_lora_rank": "q_lora_rank",
    "o_groups": "o_groups",
    "o_lora_rank": "o_lora_rank",
    "n_routed_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts",
    "n_activated_experts": "num_experts_per_tok",
    "moe_inter_dim": "moe_intermediate_size",
    "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor",
    "n_hash_layers": "num_hash_layers",
    "swiglu_limit": "swiglu_limit",
    "hc_mult": "hc_mult",
    "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps",
    "window_size": "sliding_window",
    "compress_ratios": "compress_ratios",
    "index_n_heads": "index_n_heads",
    "index_head_dim": "index_head_dim",
    "index_topk": "index_topk",
    "rope_theta": "rope_theta",
    "compress_rope_theta": "compress_rope_theta",
    "norm_eps": "rms_norm_eps",
    "max_position_embeddings": "max_position_embeddings",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "max_seq_len": "max_seq_len",
    "max_batch_size": "max_batch_size",
}
_RUNTIME = {"max_seq_len", "max_batch_size", "num_key_value_heads"}
_REQUIRED = ["vocab_size", "dim", "n_layers", "n_heads", "head_dim", "q_lora_rank", "n_routed_experts",
             "n_activated_experts", "moe_inter_dim", "compress_ratios"]
_MODEL_TYPES = {"deepseek_v4", "deepseek_v4_flash", "deepseek_v4_pro"}
# Fields a released HF config.json carries that are constants of the architecture (transformers'
# DeepseekV4Config reads them): written as they are, and a config that says otherwise is refused.
_ARCHITECTURE = {
    "hidden_act": "silu",  # SwiGLU experts (with the swiglu_limit clamp)
    "attention_bias": False,
    "mlp_bias": False,
    "norm_topk_prob": True,  # top-k routing weights renormalized to sum 1 (sqrtsoftplus / sigmoid scores)
    "tie_word_embeddings": False,  # embed and head are separate tensors
}
_HF_DEFAULTS = {"attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "pad_token_id": None}


def _check_architecture(raw: dict, source: str) -> None:
    for key, want in _ARCHITECTURE.items():
        if key in raw and raw[key] != want:
            raise DSV4Error(f"{source}: {key}={raw[key]!r} is not DeepSeek-V4 (it uses {want!r})")


def _quant_fmt(qc: dict) -> str:
    method = str(qc.get("quant_method", "")).lower()
    if not qc:
        return "bf16"
    if method in ("fp8", ""):
        return "fp8"
    if "nvfp4" in method or "modelopt" in method:
        return "nvfp4"
    raise DSV4Error(f"config.json: unsupported quantization_config.quant_method {method!r}")


def _flash() -> ModelConfig:
    return ModelConfig()


def _pro() -> ModelConfig:
    return ModelConfig(
        dim=7168, n_layers=61, n_heads=128, q_lora_rank=1536, o_groups=16, n_routed_experts=384,
        moe_inter_dim=3072, route_scale=2.5, index_topk=1024,
        compress_ratios=[128, 128] + [4, 128] * 29 + [4, 0],
    )


def _flash_h200() -> ModelConfig:
    """Flash geometry with 32 experts a layer: same bytes per decoded token, fits one H200."""
    return ModelConfig(n_routed_experts=32)


def _tiny() -> ModelConfig:
    return ModelConfig(
        vocab_size=1024, dim=256, n_layers=4, n_mtp_layers=1, n_hash_layers=2, n_heads=4, head_dim=128,
        rope_head_dim=64, q_lora_rank=128, o_groups=2, o_lora_rank=128, n_routed_experts=8,
        n_activated_experts=2, n_shared_experts=1, moe_inter_dim=128, window_size=16,
        compress_ratios=[0, 4, 128, 4, 0], index_n_heads=16, index_head_dim=128, index_topk=8,
        original_seq_len=64, max_position_embeddings=1024, max_seq_len=1024,
    )


PRESETS = {"tiny": _tiny, "flash": _flash, "pro": _pro, "flash-h200": _flash_h200}


def preset(name: str, **runtime) -> ModelConfig:
    if name not in PRESETS:
        raise DSV4Error(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    if "n_layers" in runtime and "compress_ratios" not in runtime:  # a slice of the stack: MTP stays ratio 0
        n = runtime["n_layers"]
        runtime["compress_ratios"] = cfg.compress_ratios[:n] + [0] * cfg.n_mtp_layers
    return cfg.replace(**runtime) if runtime else cfg
