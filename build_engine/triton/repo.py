"""Write and check Triton model repository entries (``REPO/NAME/config.pbtxt`` + ``REPO/NAME/N/model.plan``).

Writing is atomic: the whole model folder is assembled in a staging folder beside ``REPO`` (``REPO/../
.trtforge-staging``, same filesystem; never inside ``REPO``, where tritonserver would try to load it, unless REPO is a
mount point: then it is, with a warning), validated,
and renamed into place (an existing entry, with ``force``, is exchanged with the new one in one step), so Triton
polling the repository never sees a half-written model and a failure or a kill leaves nothing it would load.
The engine's ``manifest.json`` is copied beside the plan (``N/manifest.json``; Triton ignores it) so that
``check_entry`` can verify dims and profiles later without reading the plan.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import fsutil
from ..core.errors import CheckFailed, InputError
from ..engine.manifest import MANIFEST_NAME, Manifest
from .config import (
    TritonConfig,
    check_model_name,
    load_for_triton,
    non_batch_outputs,
    plan_config,
    render,
    serving_notes,
)
from .layout import (
    is_repository,
    recover_repository,
    repository_problems,
    staging_root,
    version_number,
    warn_leftovers,
    warn_siblings,
)
from .validate import Problem, is_other_backend, parse_config, validate_text
from .warmup import check_files as check_warmup_files
from .warmup import plan_warmup
from .warmup import write_files as write_warmup_files


@dataclass(frozen=True)
class EntryReport:
    """What ``write_entry``/``check_entry`` produced or found."""

    model_dir: Path
    config: TritonConfig | None
    versions: tuple[int, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _plan_path(engine_dir: Path, manifest: Manifest) -> Path:
    rel = Path(manifest.plan)
    if rel.is_absolute() or ".." in rel.parts:
        raise InputError(f"{engine_dir / MANIFEST_NAME}: 'plan' {manifest.plan!r} escapes the engine folder; "
                         "rebuild the engine")
    path = engine_dir / rel
    if not path.is_file():
        raise InputError(f"{path}: plan named by manifest.json is missing; rebuild the engine with 'trtforge build'")
    return path


def write_entry(engine_dir: str | Path, repo: str | Path, name: str, *, version: int = 1,
                max_batch: int | None = None, instances: int = 1, force: bool = False,
                warmup: bool = True) -> EntryReport:
    """Write ``REPO/NAME`` for the engine in ``engine_dir``; raises InputError (bad input) or CheckFailed.
    ``warmup``: one ``model_warmup`` sample per optimization profile, its data under ``NAME/warmup/``."""
    from ..core.onnx_io import sha256_file

    engine = Path(engine_dir)
    check_model_name(name)
    from .config import MAX_VERSION

    if not 1 <= version <= MAX_VERSION:
        raise InputError(f"--version {version}: Triton version folders are integers from 1 to {MAX_VERSION} "
                         "(int64)")
    manifest = load_for_triton(engine)
    plan_src = _plan_path(engine, manifest)
    cfg = plan_config(manifest, name, max_batch=max_batch, instances=instances,
                      unbatched=non_batch_outputs(manifest, engine))
    cfg, warmup_files = plan_warmup(cfg, manifest, engine) if warmup else (cfg, {})
    header = (f"Written by 'trtforge triton' from {engine.name}/manifest.json (backend {manifest.backend.name} "
              f"{manifest.backend.version}, profile {manifest.profile}, precision {manifest.precision}).")
    notes = serving_notes(manifest)
    header += "\nNote: " + " ".join(notes)
    text = render(cfg, header)
    proto, problems = validate_text(text, manifest, expected_name=name)
    if problems:  # a trtforge bug, never a user error: refuse to write a config Triton would reject
        raise CheckFailed("generated config.pbtxt is invalid: " + "; ".join(p.format("config.pbtxt") for p in problems))

    repo_path = Path(repo)
    created = _make_repo(repo_path)
    dest = repo_path / name
    want_sha = manifest.plan_sha256
    try:
        recover_repository(repo_path)  # leftovers of killed runs, an interrupted --force swap
        warn_leftovers(repo_path)
        with fsutil.atomic_dir(dest, force=force, staging_root=staging_root(repo_path)) as tmp:
            (tmp / "config.pbtxt").write_text(text, encoding="utf-8")
            write_warmup_files(tmp, warmup_files)
            bad = check_warmup_files(proto, tmp)  # a trtforge bug too: never publish files tritonserver refuses
            if bad:
                raise CheckFailed("generated warm-up data is invalid: " + "; ".join(bad))
            vdir = tmp / str(version)
            vdir.mkdir()
            shutil.copyfile(plan_src, vdir / "model.plan")
            shutil.copyfile(engine / "manifest.json", vdir / "manifest.json")
            if sha256_file(vdir / "model.plan") != want_sha:
                raise InputError(f"{plan_src}: sha256 differs from manifest.json 'plan_sha256' (the plan was "
                                 "changed after the build); rebuild the engine with 'trtforge build'")
    except BaseException:
        if created:  # leave nothing behind: the folder this call made, while it is empty. Never rmtree: another
            # run may have published its entry in it meanwhile (an interrupted run deleted that entry with it)
            with contextlib.suppress(OSError):
                repo_path.rmdir()
        raise
    warn_siblings(repo_path, name)
    return EntryReport(dest, cfg, (version,), notes=tuple(notes))


def _make_repo(repo_path: Path) -> bool:
    """Create the repository folder (not its parents, like every other output) if missing; whether this call did."""
    if repo_path.exists() and not repo_path.is_dir():
        raise InputError(f"--repo {repo_path}: exists and is not a folder; choose a repository folder")
    if repo_path.exists():
        return False
    fsutil.check_output_file(repo_path)
    try:
        repo_path.mkdir()
    except FileExistsError:  # another run made it at the same moment (was exit 3)
        return False
    return True


def _versions(model_dir: Path) -> list[int]:
    """The version folders tritonserver loads (``layout.version_number``)."""
    found = (version_number(p.name) for p in model_dir.iterdir() if p.is_dir())
    return sorted(v for v in found if v is not None)


# The model file tritonserver's other backends load by default (``default_model_filename`` overrides it).
_OTHER_FILES = {"onnxruntime_onnx": "model.onnx", "onnxruntime": "model.onnx", "pytorch_libtorch": "model.pt",
                "pytorch": "model.pt", "python": "model.py", "tensorflow_savedmodel": "model.savedmodel",
                "tensorflow_graphdef": "model.graphdef", "openvino": "model.xml"}


def _policy_and_steps(proto: Any, cfg_path: Path, versions: list[int], other: bool) -> list[str]:
    """A ``version_policy { specific }`` none of whose versions has a folder (tritonserver: "version N is specified
    ... but the version directory is not present", then "at least one version must be available"), and, for another
    backend's entry, an ensemble's step models that are not entries of its repository ("ensemble ... contains models
    that are not available")."""
    wanted = list(proto.version_policy.specific.versions) if proto.version_policy.HasField("specific") else []
    out = [f"{cfg_path}: version_policy names versions {wanted}, none of which has a folder (the entry has "
           f"{versions}); tritonserver loads nothing: add the version or fix version_policy"
           ] if wanted and not set(wanted) & set(versions) else []
    repo = _as_listed(cfg_path).parent.parent
    steps = [s.model_name for s in proto.ensemble_scheduling.step] if other and proto.HasField(
        "ensemble_scheduling") else []
    return out + [f"{cfg_path}: ensemble step model {m!r} is not in the repository {repo}; tritonserver cannot load "
                  "the ensemble: add that model or fix model_name" for m in dict.fromkeys(steps)
                  if not (repo / m / "config.pbtxt").is_file()]


def _served(proto: Any, versions: list[int]) -> set[int]:
    """The versions ``version_policy`` makes tritonserver load: the latest ``num_versions`` (default 1), all, or the
    specific ones."""
    policy = proto.version_policy if proto is not None else None
    if policy is not None and policy.HasField("all"):
        return set(versions)
    if policy is not None and policy.HasField("specific"):
        return set(policy.specific.versions) & set(versions)
    n = policy.latest.num_versions if policy is not None and policy.HasField("latest") else 1
    return set(versions[-max(n, 1):])


def _version_manifest(vdir: Path, problems: list[str]) -> Manifest | None:
    """``vdir/manifest.json`` when there is one (an older version served beside the latest); a broken one is a
    problem."""
    if not (vdir / "manifest.json").is_file():
        return None
    try:
        return load_for_triton(vdir)
    except InputError as exc:
        problems.append(str(exc))
        return None


def check_repository(repo: str | Path) -> list[EntryReport]:
    """Validate every entry of repository ``repo`` and its layout; CheckFailed lists every problem."""
    path = Path(repo)
    notes = tuple(recover_repository(path))
    problems = repository_problems(path)
    reports: list[EntryReport] = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and (child / "config.pbtxt").is_file() and not child.name.startswith("."):
            try:
                reports.append(check_entry(child, siblings=False))
            except (CheckFailed, InputError) as exc:
                problems.append(str(exc))
    if problems:
        raise CheckFailed("; ".join(problems))
    return [EntryReport(r.model_dir, r.config, r.versions, notes=notes) for r in reports]


def _as_listed(mdir: Path) -> Path:
    """The entry as tritonserver lists it: REPO's child by that name, a symlink too (it follows it, but the model's
    name is the link's, and its siblings are REPO's), so the path is made absolute without resolving links."""
    return Path(os.path.abspath(mdir))


def _refuse_version_folder(mdir: Path, entry: Path, given: str) -> None:
    """``--check REPO/NAME/1`` is a wrong argument (it failed as 'REPO/NAME/1/config.pbtxt: missing', exit 1)."""
    if version_number(entry.name) is not None and not (mdir / "config.pbtxt").exists() and (
            entry.parent / "config.pbtxt").is_file():
        raise InputError(f"--check {given}: is version folder {entry.name} of the entry {entry.parent}; pass "
                         f"REPO/NAME ({entry.parent}) or REPO")


def _read_config(cfg_path: Path) -> tuple[str, bool]:
    """The text of ``config.pbtxt`` without a leading UTF-8 BOM (so that every other rule is judged, at the file's
    own line numbers), and whether it had one: tritonserver's text-format parser does not skip it."""
    try:
        data = cfg_path.read_bytes()
    except OSError as exc:
        raise CheckFailed(f"{cfg_path}: unreadable ({exc.strerror or exc}); make it readable") from exc
    try:
        return data.decode("utf-8-sig"), data.startswith(codecs.BOM_UTF8)
    except UnicodeDecodeError as exc:
        what = ("UTF-16 text (a Windows editor's 'Unicode')" if data.startswith((codecs.BOM_UTF16_LE,
                codecs.BOM_UTF16_BE)) else f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        raise CheckFailed(f"{cfg_path}: {what}; tritonserver reads it as UTF-8: save it as UTF-8, or rewrite the entry "
                          "with 'trtforge triton ENGINE --repo REPO --name NAME --force'") from exc


def _served_manifests(mdir: Path, text: str, versions: list[int], problems: list[str]) -> dict[int, Manifest]:
    """The engine manifest of each version ``version_policy`` makes tritonserver load (``_served``; the latest
    version when it serves none), where the version has one: the config must fit each of those engines, and only
    those (a version the policy leaves out may be another engine). A broken manifest is a problem."""
    proto, _ = parse_config(text)
    served = sorted(_served(proto, versions)) or versions[-1:]
    found = {v: _version_manifest(mdir / str(v), problems) for v in served}
    return {v: m for v, m in found.items() if m is not None}


def _older_engine_problems(text: str, cfg_path: Path, manifests: dict[int, Manifest],
                           found: list[Problem]) -> list[str]:
    """What the config gets wrong for a served version other than the latest (tritonserver loads each version with
    the one config), each named with that version's manifest."""
    latest = max(manifests) if manifests else None
    seen = {p.reason for p in found}
    out: list[str] = []
    for v, man in manifests.items():
        if v == latest:
            continue
        _, more = validate_text(text, man)
        out += [f"{p.format(str(cfg_path))} (for version {v}, per {v}/manifest.json; tritonserver loads it with this "
                "config: rewrite that version from its engine or leave it out of version_policy)"
                for p in more if p.reason not in seen]
    return out


def check_entry(model_dir: str | Path, *, siblings: bool = True) -> EntryReport:
    """Validate an existing ``REPO/NAME`` (and, with ``siblings``, that nothing else in ``REPO`` stops tritonserver
    from loading the repository). Raises InputError if it is not a model folder, CheckFailed if broken."""
    from ..core.onnx_io import sha256_file

    mdir = Path(model_dir)
    entry = _as_listed(mdir)
    repo = entry.parent
    # First: an interrupted --force swap of this very entry is completed (the entry may be missing until then).
    notes = tuple(recover_repository(repo)) if siblings and repo.is_dir() else ()
    if not mdir.is_dir():
        raise InputError(f"--check {model_dir}: not a folder; pass REPO/NAME of a Triton model (or REPO)")
    _refuse_version_folder(mdir, entry, str(model_dir))
    check_model_name(entry.name)
    cfg_path = mdir / "config.pbtxt"
    if not cfg_path.is_file():
        raise CheckFailed(f"{cfg_path}: missing; write it with 'trtforge triton ENGINE --repo REPO --name NAME'")
    text, bom = _read_config(cfg_path)
    from .config import MAX_VERSION

    versions = _versions(mdir)
    problems: list[str] = repository_problems(repo, skip=entry.name) if siblings else []
    problems += [f"{cfg_path}:1: starts with a UTF-8 byte-order mark (as Windows editors save), which tritonserver "
                 "refuses ('Interpreting non ascii codepoint 239'); save it as UTF-8 without a BOM"] if bom else []
    problems += [f"{mdir}/{v}: version {v} is above int64 ({MAX_VERSION}); tritonserver refuses it"
                 for v in versions if v > MAX_VERSION]
    if not versions:
        problems.append(f"{mdir}: no numeric version folder (e.g. {mdir}/1/model.plan); Triton will load nothing")
    manifests = _served_manifests(mdir, text, versions, problems)
    manifest = manifests[max(manifests)] if manifests else None
    # Without an engine manifest, another backend's entry (an ensemble, a Python model) gets the generic rules only.
    proto, found = validate_text(text, manifest, expected_name=entry.name, other_backends=manifest is None)
    problems += [p.format(str(cfg_path)) for p in found]
    problems += _older_engine_problems(text, cfg_path, manifests, found)
    problems += check_warmup_files(proto, mdir) if proto is not None else []
    other = manifest is None and proto is not None and is_other_backend(proto)
    plan_name: str = (proto.default_model_filename if proto is not None and proto.default_model_filename
                      else _OTHER_FILES.get(proto.platform or proto.backend, "") if other else "model.plan")
    problems += _policy_and_steps(proto, cfg_path, versions, other) if proto is not None else []
    # Only the versions tritonserver loads: it never looks into another version folder (an older one being removed)
    served = sorted(_served(proto, versions)) if plan_name else []  # an ensemble has no model file to look for
    for v in served:
        plan = mdir / str(v) / plan_name
        if not (plan.is_file() or (other and plan.is_dir())):  # a SavedModel is a folder
            problems.append(f"{plan}: missing; Triton cannot load version {v}")
        elif v in manifests and sha256_file(plan) != manifests[v].plan_sha256:
            problems.append(f"{plan}: sha256 differs from {v}/manifest.json; rewrite the entry from its engine")
    if problems:
        raise CheckFailed("; ".join(problems))
    from .config import config_from_proto

    return EntryReport(mdir, config_from_proto(proto), tuple(versions), notes=notes)


__all__ = ["EntryReport", "Problem", "check_entry", "check_repository", "is_repository", "write_entry"]
