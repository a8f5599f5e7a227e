"""How ``kv-plan`` reads an HF ``config.json`` beyond the plain decoder keys: the ``tie_word_embeddings`` default of
the model type, and multimodal configs (Llava, Mllama, Qwen2-VL style) whose decoder is nested under
``text_config``."""

from __future__ import annotations

from typing import Any

from trtforge.build_engine.core.errors import InputError

#: ``model_type``s whose transformers config class ties the LM head to the embedding when config.json omits
#: ``tie_word_embeddings`` (Gemma's configs do omit it); Llama, Mistral, Qwen2, Phi-3, Mixtral default to untied
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2")


def tied(cfg: dict[str, Any]) -> bool:
    """``tie_word_embeddings`` as transformers reads it: the config's value, else its model type's default. A value
    that is not true/false is refused (``"false"`` read as tied dropped the LM head from the weights, silently)."""
    given = cfg.get("tie_word_embeddings")
    if given is None:
        return cfg.get("model_type") in TIED_BY_DEFAULT
    if not isinstance(given, bool):
        raise InputError(f"tie_word_embeddings must be true or false, got {given!r}")
    return given


def sliding_note(cfg: dict[str, Any]) -> str:
    """The plan's word on a ``sliding_window`` shorter than the context ("" when none is in use): every layer is
    planned as full attention, so the requests that fit are a lower bound (``kv_plan`` module docstring)."""
    window, context = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        # "4096" (a string) was skipped, and with it the lower-bound warning
        raise InputError(f"sliding_window must be an integer number of tokens or null, got {window!r}")
    if cfg.get("use_sliding_window") is False or window is None:
        return ""
    if window <= 0 or (isinstance(context, int) and window >= context):
        return ""
    return (f"sliding_window {window}: every layer is planned as full attention (a request's blocks grow with all "
            "its tokens), so the requests that fit are a lower bound")


def decoder_config(cfg: dict[str, Any], source: str) -> tuple[dict[str, Any], str, str]:
    """The decoder's keys, the source to name in errors, and what is left unmodelled ("" when nothing).

    A config without ``num_hidden_layers`` whose ``text_config`` is an object is multimodal: its decoder is planned
    from ``text_config`` (with the top level's ``quantization_config`` and ``tie_word_embeddings`` where the nested
    one has none); the vision tower's weights (``vision_config``, nested or beside a top-level decoder as in
    Qwen2-VL) are not counted, so the plan is an upper bound."""
    text = cfg.get("text_config")
    if "num_hidden_layers" in cfg or not isinstance(text, dict):  # Qwen2-VL: the decoder at the top, a tower beside
        _refuse_cross_attention(cfg, f"{source}: ")
        beside = isinstance(cfg.get("vision_config"), dict)
        return cfg, source, ("the vision_config tower's weights are not counted, so the KV capacity is an upper "
                             "bound") * beside
    inner = dict(text)
    for key in ("quantization_config", "tie_word_embeddings", "_name_or_path"):
        if inner.get(key) is None and cfg.get(key) is not None:
            inner[key] = cfg[key]
    _refuse_cross_attention(inner, f"{source}: text_config.")
    tower = " (the vision_config tower, the projector)" if "vision_config" in cfg else ""
    return inner, f"{source} text_config", (f"the decoder is read from text_config; the weights outside it{tower} "
                                            "are not counted, so the KV capacity is an upper bound")


def _refuse_cross_attention(cfg: dict[str, Any], where: str) -> None:
    if cfg.get("cross_attention_layers"):
        raise InputError(f"{where}cross_attention_layers {cfg['cross_attention_layers']!r}: cross-attention layers "
                         "(Mllama) cache the image's K/V, not the text tokens', and are not modeled; plan it with "
                         "its serving engine's own estimator")


def context_note(cfg: dict[str, Any]) -> str:
    """The warning when the config gives no context length: 131072 tokens is assumed (transformers' own default
    differs by architecture: 2048 for Llama), and prompt-too-long is judged by it."""
    if cfg.get("max_position_embeddings") is not None:
        return ""
    return ("the config has no max_position_embeddings: a context of 131072 tokens is assumed (transformers' Llama "
            "default is 2048) and prompts are judged too long by it; add the model's context length to the config")
