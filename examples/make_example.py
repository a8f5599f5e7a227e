"""Write the example Llama models and their HF config into a folder.

    python -m trtforge.examples.make_example OUT_DIR [--bigger] [--seed N]

writes ``OUT_DIR/llama_fp32.onnx``, ``OUT_DIR/llama_fp16_autocast.onnx`` and ``OUT_DIR/config.json`` (each written
atomically, so an interrupted run leaves no half-written file).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from trtforge.build_engine.core.fsutil import write_json
from trtforge.build_engine.core.onnx_save import save_model

from .llama import BIGGER, LlamaConfig, Variant, hf_config, make_llama

FILES: dict[Variant, str] = {"fp32": "llama_fp32.onnx", "fp16-autocast": "llama_fp16_autocast.onnx"}


def write_example(out_dir: str | Path, config: LlamaConfig | None = None, seed: int = 0) -> dict[str, Path]:
    """Write both variants and config.json into ``out_dir`` (created if missing); returns the written paths."""
    config = LlamaConfig() if config is None else config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for variant, filename in FILES.items():
        paths[variant] = out / filename
        save_model(make_llama(config, variant, seed), paths[variant])
    paths["config"] = out / "config.json"
    write_json(paths["config"], hf_config(config))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make_example", description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="folder to write into (created if missing)")
    p.add_argument("--bigger", action="store_true", help="the 4-layer hidden-512 benchmark configuration")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = p.parse_args(argv)
    for name, path in write_example(args.out_dir, BIGGER if args.bigger else LlamaConfig(), args.seed).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
