"""`hf:DIR` targets: a Hugging Face transformers causal LM or encoder-decoder generator (T5, BART, Whisper) from
a local folder, decoded as `generate` does (an encoder-decoder's encoder once, before the steps).

DIR is a model folder (config.json, and weights if it has any) or a config.json itself. No network
access, ever: the hub is switched offline before transformers is imported, every load is
local_files_only, and no remote code runs. A folder without weights gets seeded random ones
(`from_config` under torch.manual_seed(seed)), so a config is enough to audit an architecture.

The decode step is the one `generate` runs between two tokens (transformers 5's `_sample`), with the
inputs the installed generate prepares before its loop: its `position_ids`, the all-ones mask dropped
where it drops it, and the model's own cache where generate hands it none (`generation_inputs`):
- prepare(i), host side, not audited (generate runs it outside its compiled forward too): append
  the previous token to the ids, `_update_model_kwargs_for_generation` (the position ids and any 2D
  attention mask grow by one), `prepare_inputs_for_generation`, then stage every tensor input (each tensor of a
  dict input too: the per-layer-type masks) into a static buffer with copy_ when its shape has not
  changed, as any graph runner does with its inputs;
- step(), audited: `model(**model_inputs, return_dict=True)` and the greedy next token, written
  into a static output buffer (out=), so that every finding is the model's.

`cache`: "dynamic" (DynamicCache, grows with torch.cat) or "static" (StaticCache sized for the
whole run: prompt + every scanned step). What the scan finds is then in transformers' own files.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import torch

from audit.errors import AuditError

__all__ = ["CACHES", "HFDecode", "hf_target"]

CACHES = ("dynamic", "static")
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def _offline() -> None:
    """Before transformers (and huggingface_hub) are imported: never reach the network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import sys

    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported earlier in this process: flip the cached flag too
        hub.HF_HUB_OFFLINE = True


def _import_transformers(spec: str):
    _offline()
    try:
        import transformers
    except ImportError:
        raise AuditError(f"--target {spec!r}: hf: targets need transformers (pip install -e \".[dev]\")") from None
    return transformers


def _config_file(spec: str, where: str) -> tuple[Path, Path]:
    """(config.json, model folder) for DIR or DIR/config.json; one-line errors otherwise."""
    if not where:
        raise AuditError(f"--target {spec!r}: expected hf:DIR (a local model folder or its config.json)")
    p = Path(where).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise AuditError(f"--target {spec!r}: {where} has no config.json (hf: reads local folders only)")
        return cfg, p
    if p.is_file():
        if p.suffix != ".json":
            raise AuditError(f"--target {spec!r}: {where} is not a folder or a config .json file")
        return p, p.parent
    raise AuditError(f"--target {spec!r}: no such folder or file {where} (hf: reads local folders only, "
                     "nothing is downloaded)")


def load_config(spec: str, where: str):
    """The transformers config of DIR (or of a config.json), checked to be a known causal LM or
    encoder-decoder (text or speech) generator."""
    transformers = _import_transformers(spec)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg_path, folder = _config_file(spec, where)
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AuditError(f"--target {spec!r}: {cfg_path} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise AuditError(f"--target {spec!r}: {cfg_path} is not a JSON object")
    mtype = data.get("model_type")
    if not mtype:
        raise AuditError(f"--target {spec!r}: {cfg_path} has no model_type")
    if mtype not in CONFIG_MAPPING:
        raise AuditError(f"--target {spec!r}: unknown architecture {mtype!r}: transformers "
                         f"{transformers.__version__} has no such model_type (remote code is never run)")
    if not any(mtype in names for names in _generators().values()):
        raise AuditError(f"--target {spec!r}: {mtype!r} is not a causal language model or an encoder-decoder "
                         f"generator in transformers {transformers.__version__} (hf: targets decode with "
                         f"{', '.join(_generators())})")
    try:
        cfg = CONFIG_MAPPING[mtype].from_dict(data)
    except Exception as e:  # noqa: BLE001 - a bad config is the user's one-line error
        raise AuditError(f"--target {spec!r}: {cfg_path}: transformers rejects the config "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return cfg, folder


def _generators() -> dict:
    """The auto classes that generate with, by name -> the model types each covers."""
    from transformers.models.auto import modeling_auto as auto

    return {"AutoModelForCausalLM": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            "AutoModelForSeq2SeqLM": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
            "AutoModelForSpeechSeq2Seq": auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES}


def _auto_class(cfg):
    """The class generate would run this config with: an encoder-decoder config (BART's, T5's, Whisper's) as
    the encoder-decoder generator, even where transformers also has a decoder-only class for it
    (`BartForCausalLM`); any other as a causal LM."""
    import transformers

    found = [name for name, names in _generators().items() if cfg.model_type in names]
    encdec = [n for n in found if n != "AutoModelForCausalLM"]
    pick = encdec[0] if encdec and (getattr(cfg, "is_encoder_decoder", False) or len(found) == 1) else found[0]
    return getattr(transformers, pick)


def _has_weights(folder: Path) -> bool:
    return any(any(folder.glob(pat)) for pat in _WEIGHTS)


def load_model(spec: str, where: str, device: str, seed: int = 0):
    """(model in eval mode on `device`, config, whether the weights are random)."""
    cfg, folder = load_config(spec, where)
    auto = _auto_class(cfg)
    random = not _has_weights(folder)
    try:
        if random:
            torch.manual_seed(seed)
            model = auto.from_config(cfg)
        else:
            model = auto.from_pretrained(folder, config=cfg, local_files_only=True, trust_remote_code=False)
    except AuditError:
        raise
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AuditError(f"--target {spec!r}: building the model raised {type(e).__name__}: {msg}") from None
    return model.to(device).eval(), cfg, random


CACHE_NAMES = ("cache", "cache_params", "past_key_values")  # 5.2x; state-space models before it; the rest


def cache_kwarg(model) -> str:
    """The name this model's generation inputs give the cache, as generate passes it: the first of
    CACHE_NAMES that `prepare_inputs_for_generation` names, else that `forward` names, else
    `past_key_values`. A Mamba-style model takes `cache_params`: handed `past_key_values`, its
    forward never sees the cache, and the generic preparation turns its 2D mask into a dict."""
    for fn in (model.prepare_inputs_for_generation, model.forward):
        params = inspect.signature(fn).parameters
        if (name := next((n for n in CACHE_NAMES if n in params), None)) is not None:
            return name
    return "past_key_values"


def _takes_default_cache(model) -> bool:
    """Whether generate hands this model a DynamicCache / StaticCache (not one that keeps its own: MiniMax,
    RWKV, xLSTM, Reformer, XLNet), as the installed generate decides it."""
    ask = getattr(model, "_supports_default_dynamic_cache", None)
    return True if ask is None else bool(ask())


def generation_inputs(model, input_ids, model_kwargs: dict) -> None:
    """What the installed generate adds to the model kwargs before its first forward, in its order:
    - position ids from the 2D mask, when the forward takes them (later steps extend them by one, in
      `_update_model_kwargs_for_generation`), so a model's `position_ids is None` fallback (positions from
      the cache's length, a Python int for a sliding-window layer) is not what the step runs;
    - then, in versions that do it (transformers 5.2x: `GenerationConfig._mask_length`), the all-ones 2D
      mask dropped: no padding, the model builds its causal mask itself."""
    from transformers import GenerationConfig, StaticCache

    cfg = model.config
    encdec = bool(getattr(cfg, "is_encoder_decoder", False))
    params = inspect.signature(model.forward).parameters
    prepare = getattr(model, "_prepare_position_ids_for_generation", None)
    if prepare is not None and "position_ids" in params and not encdec and model_kwargs.get("position_ids") is None:
        model_kwargs["position_ids"] = prepare(input_ids, model_kwargs)
    flash_static = "flash" in str(getattr(cfg, "_attn_implementation", "") or "") and \
        any(isinstance(model_kwargs.get(k), StaticCache) for k in CACHE_NAMES)
    mask = model_kwargs.get("attention_mask")
    if ("_mask_length" in getattr(GenerationConfig, "__annotations__", {}) and not encdec and "attention_mask" in params
            and not flash_static and mask is not None and bool((mask == 1).all())):
        model_kwargs["attention_mask"] = None


def encoder_decoder_inputs(spec: str, model, prompt, model_kwargs: dict, cache: str, cache_cfg, self_cache, gen):
    """What generate sets up for an encoder-decoder model before its loop -> (cache, decoder ids): the encoder
    run once on the prompt (token ids, or random features for a speech encoder) and its outputs kept in the
    model kwargs for every decoder step (not audited: no step repeats it); an EncoderDecoderCache of the
    self-attention cache asked for and a cross-attention cache of the same kind (a static one sized to the
    encoder's output, as generate sizes it); the decoder ids the decoder start token."""
    from transformers import DynamicCache, EncoderDecoderCache, StaticCache

    batch, main = prompt.shape[0], model.main_input_name
    if main == "input_ids":
        enc_in = {"input_ids": prompt, "attention_mask": model_kwargs["attention_mask"]}
    else:
        enc_in = {main: _features(spec, model, main, batch, gen).to(prompt.device)}
        model_kwargs.pop("attention_mask")
    with torch.no_grad():
        enc = model.get_encoder()(**enc_in, return_dict=True)
    model_kwargs["encoder_outputs"] = enc
    cross = StaticCache(config=cache_cfg, max_cache_len=enc[0].shape[1]) if cache == "static" \
        else DynamicCache(config=cache_cfg)
    gc, cfg = model.generation_config, model.config  # generate's order: the start token, else the bos token
    start = next((t for t in (gc.decoder_start_token_id, getattr(cfg, "decoder_start_token_id", None), gc.bos_token_id,
                              getattr(cfg, "bos_token_id", None)) if t is not None), None)
    if start is None:
        raise AuditError(f"--target {spec!r}: the config names no decoder_start_token_id or bos_token_id, which "
                         "generate starts an encoder-decoder's decoder with")
    start = start[0] if isinstance(start, (list, tuple)) else int(start)
    return EncoderDecoderCache(self_cache, cross), torch.full((batch, 1), start, dtype=torch.long,
                                                              device=prompt.device)


def _features(spec: str, model, main: str, batch: int, gen) -> torch.Tensor:
    """Random log-mel features of the one length a Whisper-style encoder takes (two frames a position)."""
    cfg = model.config
    mels, positions = getattr(cfg, "num_mel_bins", None), getattr(cfg, "max_source_positions", None)
    if main != "input_features" or not mels or not positions:
        raise AuditError(f"--target {spec!r}: {type(model).__name__} encodes `{main}`: hf: targets build token ids "
                         "or log-mel features (num_mel_bins, max_source_positions) only")
    return torch.randn(batch, mels, 2 * positions, generator=gen).to(model.dtype)


class _Outputs(dict):
    """The part of a forward's output that `_update_model_kwargs_for_generation` reads (the cache),
    readable as a mapping and as attributes, whichever this transformers version does."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class HFDecode:
    """One greedy decode step of a transformers causal LM, driven the way generate drives it."""

    def __init__(self, spec: str, where: str, device: str, cache: str = "dynamic", batch: int = 1,
                 prompt_len: int = 8, seed: int = 0, max_new_tokens: int = 64):
        if cache not in CACHES:
            raise AuditError(f"--cache must be one of {', '.join(CACHES)}, not {cache!r}")
        if batch < 1 or prompt_len < 1:
            raise AuditError("--batch and --prompt-len must be >= 1")
        self.device = torch.device(device)
        self.model, self.config, self.random_weights = load_model(spec, where, device, seed)
        from transformers import DynamicCache, StaticCache

        text_cfg = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") \
            else self.model.config
        vocab = int(getattr(text_cfg, "vocab_size", 0) or 0)
        if vocab < 2:
            raise AuditError(f"--target {spec!r}: the config has no vocab_size")
        self.max_cache_len = prompt_len + max_new_tokens + 1
        cache_cfg = self.model.config.get_text_config(decoder=True) \
            if hasattr(self.model.config, "get_text_config") else self.model.config
        own_cache = not _takes_default_cache(self.model)
        if own_cache and cache == "static":
            raise AuditError(f"--target {spec!r}: {type(self.model).__name__} keeps a cache of its own, which "
                             "generate does not replace: --cache static does not apply (use --cache dynamic)")
        if own_cache:
            self.cache = None  # the model makes its own in the prefill, as under generate
        elif cache == "static":
            self.cache = StaticCache(config=cache_cfg, max_cache_len=self.max_cache_len)
        else:
            self.cache = DynamicCache(config=cache_cfg)
        gen = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(self.device)
        self.cache_key = cache_kwarg(self.model)
        self.model_kwargs = {"use_cache": True,
                             "attention_mask": torch.ones(batch, prompt_len, dtype=torch.long, device=self.device)}
        self.encdec = bool(getattr(self.model.config, "is_encoder_decoder", False))
        self.prompt_ids = self.input_ids  # what was prefilled (an encoder-decoder: what the encoder read)
        if self.encdec:  # from here on input_ids are the decoder's
            self.cache, self.input_ids = encoder_decoder_inputs(spec, self.model, self.input_ids, self.model_kwargs,
                                                                cache, cache_cfg, self.cache, gen)
        if self.cache is not None:
            self.model_kwargs[self.cache_key] = self.cache
        generation_inputs(self.model, self.input_ids, self.model_kwargs)
        self.buffers: dict = {}
        with torch.no_grad():  # the prefill, as generate's _prefill: the whole prompt at once
            inputs = self.model.prepare_inputs_for_generation(self.input_ids, is_first_iteration=True,
                                                              **self.model_kwargs)
            out = self.model(**inputs, return_dict=True)
        if self.cache is None:
            self.cache = next((out[k] for k in (self.cache_key, *CACHE_NAMES) if out.get(k) is not None), None)
        self.next = out.logits[:, -1].argmax(-1)   # written in place by every step
        self.inputs: dict = {}

    def prepare(self, i: int) -> None:
        """Host-side bookkeeping between two forwards, as in generate's loop; inputs staged in place."""
        self.input_ids = torch.cat([self.input_ids, self.next[:, None].to(self.input_ids.dtype)], dim=-1)
        self.model_kwargs = self.model._update_model_kwargs_for_generation(_Outputs({self.cache_key: self.cache}),
                                                                            self.model_kwargs,
                                                                            is_encoder_decoder=self.encdec)
        inputs = self.model.prepare_inputs_for_generation(self.input_ids, next_sequence_length=1,
                                                          **self.model_kwargs)
        self.inputs = {k: self._stage(k, v) for k, v in inputs.items()}

    def _stage(self, key: str, v):
        """A static buffer per tensor input, refilled with copy_ while its shape holds (a new one
        when it changes: that input is then a dynamic shape, and the scan says so). A dict of
        tensors (the per-layer-type masks `prepare_inputs_for_generation` builds for models with
        `layer_types`: Qwen3, Gemma2 ...) is staged entry by entry, as a graph runner flattens it."""
        if isinstance(v, dict):
            staged = {k: self._stage(f"{key}.{k}", x) for k, x in v.items()}
            return staged if type(v) is dict else type(v)(**staged)  # encoder_outputs keeps its ModelOutput type
        if not isinstance(v, torch.Tensor):
            return v
        buf = self.buffers.get(key)
        if buf is None or buf.shape != v.shape or buf.dtype != v.dtype or buf.device != v.device:
            buf = self.buffers[key] = v.clone()
        else:
            buf.copy_(v)
        return buf

    @torch.no_grad()
    def step(self):
        out = self.model(**self.inputs, return_dict=True)
        torch.argmax(out.logits[:, -1], dim=-1, out=self.next)  # greedy, into a static buffer: nothing
        return out.logits                                        # of the driver's own in the inventory


def hf_target(spec: str, where: str, options: dict):
    """The factory `make(device)` for hf:DIR with the scan's options (cache, batch, prompt_len, seed)."""
    load_config(spec, where)  # bad paths and unknown architectures fail here, before any factory call
    kw = {k: options[k] for k in ("cache", "batch", "prompt_len", "seed", "max_new_tokens") if options.get(k) is not None}
    return lambda device: HFDecode(spec, where, device, **kw)
