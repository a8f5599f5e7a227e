"""``trtforge triton``: write or check a Triton model repository entry from an engine folder's manifest.json.

    trtforge triton OUTDIR --repo REPO --name NAME [--version N] [--max-batch B] [--instances K] [--force]
    trtforge triton --check REPO/NAME    (or --check REPO: every entry)

Exit codes: 0 written / valid; 1 ``--check`` found problems; 2 bad input (missing or invalid manifest, unsafe name,
Python-only plugin, ``--max-batch`` above the engine's range).

Warm-up (``--warmup``, the default; ``--no-warmup`` skips it): Triton ``model_warmup`` samples from the manifest,
see build_engine/triton/warmup.py.
"""

from __future__ import annotations

from argparse import BooleanOptionalAction, Namespace
from collections.abc import Sequence

from ._common import ArgumentParser, UsageError, make_parser, run_command


def build_parser() -> ArgumentParser:
    p = make_parser("trtforge triton", "Write (or --check) a Triton model repository entry for a trtforge engine: "
                                       "REPO/NAME/config.pbtxt and REPO/NAME/N/model.plan, from manifest.json.")
    p.add_argument("engine_dir", nargs="?", metavar="OUTDIR", help="engine folder written by 'trtforge build'")
    p.add_argument("--repo", help="Triton model repository folder (created if missing)")
    p.add_argument("--name", help="model name (folder name under REPO): [A-Za-z0-9_.-], not starting with '.'")
    p.add_argument("--version", type=int, default=1, help="version folder (integer >= 1; default 1)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="max_batch_size (default: the largest batch every optimization profile admits, i.e. the "
                        "smallest profile maximum; 0 when the first dim is not a dynamic batch from 1, or when the "
                        "engine folder's model.onnx names an output's first dim as a sequence or other axis; 0 "
                        "disables Triton batching)")
    p.add_argument("--instances", type=int, default=1, help="GPU instances (instance_group count; default 1)")
    p.add_argument("--warmup", action=BooleanOptionalAction, default=True,
                   help="write Triton model_warmup samples, one per optimization profile at its opt shape, with "
                        "seeded random data in valid ranges under NAME/warmup/ (default: on; --no-warmup: none)")
    p.add_argument("--force", action="store_true", help="replace an existing REPO/NAME (atomically)")
    p.add_argument("--check", metavar="REPO/NAME",
                   help="validate an existing entry (and that nothing else in REPO stops tritonserver), or every entry "
                        "of REPO, instead of writing")
    return p


def _run(args: Namespace) -> int:
    from pathlib import Path

    from ..triton.repo import check_entry, check_repository, is_repository, write_entry

    if args.check:
        if args.engine_dir or args.repo or args.name:
            raise UsageError("trtforge triton: --check REPO/NAME takes no OUTDIR, --repo or --name")
        # REPO/NAME: that entry in full, and the rest of REPO for what would stop tritonserver; REPO: every entry.
        reports = check_repository(args.check) if is_repository(Path(args.check)) else [check_entry(args.check)]
        for report in reports:
            cfg = report.config
            assert cfg is not None
            print(f"ok: {report.model_dir} is a valid Triton entry (versions {list(report.versions)}, max_batch_size "
                  f"{cfg.max_batch_size}, {len(cfg.inputs)} inputs, {len(cfg.outputs)} outputs, profiles "
                  f"{list(cfg.profiles)})")
        return 0
    if not args.engine_dir or not args.repo or args.name is None:
        raise UsageError("trtforge triton: give OUTDIR --repo REPO --name NAME (or --check REPO/NAME); "
                         "see 'trtforge triton --help'")
    from pathlib import Path

    from ..core import paths
    from ..core.errors import InputError

    if args.repo == "-":  # as every output: '-' is not stdout here, and not a folder named '-' in the cwd
        raise InputError("--repo '-': trtforge writes a Triton repository folder, not stdout; give a folder path "
                         "(./- for a folder named '-')")
    # REPO/NAME is replaced as a whole (with --force): it must not be, or hold, the engine folder it reads.
    paths.check(inputs=[("OUTDIR", args.engine_dir)],
                folders=[(f"--repo {args.repo} --name", Path(args.repo) / args.name)])
    report = write_entry(args.engine_dir, args.repo, args.name, version=args.version, max_batch=args.max_batch,
                         instances=args.instances, force=args.force, warmup=args.warmup)
    cfg = report.config
    assert cfg is not None
    batching = (f"max_batch_size {cfg.max_batch_size}, preferred {list(cfg.preferred_batch_sizes)}"
                if cfg.max_batch_size else "max_batch_size 0 (no Triton batching: full dims)")
    print(f"wrote {report.model_dir}/config.pbtxt and {report.model_dir}/{args.version}/model.plan "
          f"({batching}; {cfg.instance_count} GPU instance(s), profiles {list(cfg.profiles)}; "
          f"{len(cfg.warmup)} warm-up sample(s))")
    from ..core import log

    for note in report.notes:  # on stderr as 'note: ...' (logged: --quiet drops notes, as every command's)
        log.logger("cli.triton").info("%s", note)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), _run, argv)
