"""What in a Triton model repository would stop tritonserver from loading it, beyond one entry's config.

tritonserver 2.51 (``--strict-model-config=true``, checked by tests/build_engine/triton_server) treats every folder
directly under the repository as a model, hidden ones included: a folder without ``config.pbtxt`` ("Poll failed for
model directory ... failed to open text file"), or a config with no numeric version folder ("at least one version
must be available"), makes it report "failed to load all models" and, with the default ``--exit-on-error``, exit.
Plain files directly under the repository are ignored. ``repository_problems`` lists those folders, each with the
fix (for a leftover of an interrupted write, the exact command to remove it).

Before looking, ``recover_repository`` finishes or rolls back an interrupted ``trtforge triton --force`` (its
staging folder, beside the repository, records the swap) and removes trtforge's own leftovers of killed runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..core import staging


def recover_repository(repo: Path) -> list[str]:
    """Complete interrupted swaps and remove stale staging folders beside and inside ``repo``; what was done."""
    done = staging.sweep(repo.resolve().parent) if repo.resolve().parent != repo.resolve() else []
    return done + staging.sweep(repo)


def warn_leftovers(repo: Path) -> None:
    """For writers: name each hidden folder in ``repo`` (tritonserver would fail on it) with the command to remove it;
    never removed here, since no lock tells whether it is still being written (trtforge < 0.2 staged there)."""
    import logging

    log = logging.getLogger("trtforge.triton.layout")
    for p in staging.legacy_temporaries(repo):
        if p.is_dir():
            log.warning("%s looks like a leftover of an interrupted write; tritonserver fails to load the "
                        "repository while it is there: rm -rf %s", p, shlex.quote(str(p)))


def staging_root(repo: Path) -> Path:
    """Where a writer stages its entry: beside the repository (its parent, where tritonserver never looks), unless
    the repository is a mount point (a container's volume: no folder of its filesystem beside it) or its parent is not
    writable (a user's repository under a root-owned or read-only folder). Then it is staged inside it
    (``REPO/.trtforge-staging``, as ``fsutil.atomic_dir`` falls back to), where a tritonserver starting or polling
    meanwhile, or after a kill -9, fails on it; said once, with the fix."""
    import logging
    import os

    here, parent = repo.resolve(), repo.resolve().parent
    if not os.access(here, os.W_OK | os.X_OK):
        from ..core.errors import InputError

        raise InputError(f"--repo {repo}: cannot write there (a read-only filesystem or no write permission); "
                         "choose a repository folder you can write to")
    if parent == here:
        return here
    if os.stat(parent).st_dev != os.stat(here).st_dev:
        why, fix = "is a mount point", "mount the repository's parent folder instead"
    elif not os.access(parent, os.W_OK | os.X_OK):
        why, fix = f"is in a folder trtforge cannot write to ({parent})", "make that folder writable"
    else:
        return parent
    logging.getLogger("trtforge.triton.layout").warning(
        "%s %s: the entry is staged inside it (%s) while it is written, and a tritonserver that loads the repository "
        "meanwhile, or after this run is killed, fails on that folder (the next trtforge triton run removes it); %s",
        repo, why, repo / staging.STAGING, fix)
    return here


def warn_siblings(repo: Path, name: str) -> None:
    """For writers, once ``repo/name`` is written: name each other folder of ``repo`` that stops tritonserver from
    loading the repository (an engine folder copied in, a ``.ipynb_checkpoints``), with its fix. The entry is valid;
    the repository is not, and only ``--check`` said so."""
    import logging

    log = logging.getLogger("trtforge.triton.layout")
    legacy = {p.name for p in staging.legacy_temporaries(repo)}  # warn_leftovers named those before the write
    for child in sorted(repo.iterdir()):
        if child.is_dir() and child.name != name and child.name not in legacy:
            for problem in entry_problems(child):
                log.warning("%s", problem)


def version_number(name: str) -> int | None:
    """The version a folder name gives, as tritonserver 2.51 reads it: ASCII digits without a leading zero ("0"
    itself is version 0); it ignores "01" ("contains leading zeros") and other digits ("fails to convert")."""
    if not (name.isascii() and name.isdigit()) or (len(name) > 1 and name[0] == "0"):
        return None
    return int(name)


def entry_problems(mdir: Path) -> list[str]:
    """The layout problems of one folder under a repository (config and version folders present)."""
    rm = f"rm -rf {shlex.quote(str(mdir))}"
    if mdir.name.startswith("."):
        return [f"{mdir}: hidden folder in the model repository (a leftover of an interrupted write?); "
                f"tritonserver tries to load it as a model and fails: remove it ({rm})"]
    if not (mdir / "config.pbtxt").is_file():
        return [f"{mdir}: no config.pbtxt; tritonserver cannot load this folder and fails to load the repository: "
                f"write it with 'trtforge triton ENGINE --repo {shlex.quote(str(mdir.parent))} --name {mdir.name} "
                f"--force' or remove it ({rm})"]
    if not any(p.is_dir() and version_number(p.name) is not None for p in mdir.iterdir()):
        return [f"{mdir}: no numeric version folder (e.g. {mdir}/1/model.plan); tritonserver finds no version to "
                "load"]
    return []


def repository_problems(repo: Path, skip: str | None = None) -> list[str]:
    """Layout problems of every folder directly under ``repo`` except ``skip`` (the entry checked in full)."""
    problems: list[str] = []
    for child in sorted(repo.iterdir()):
        if child.is_dir() and child.name != skip:
            problems += entry_problems(child)
    return problems


def is_repository(path: Path) -> bool:
    """Whether ``path`` looks like a repository (not an entry): no config.pbtxt, and some folder under it has one, or
    it has folders and none is a version folder (an entry that lost its config keeps those; a repository holding
    only folders tritonserver cannot load, such as an engine folder copied in, is checked as a repository). An empty
    folder is an entry missing its config."""
    if not path.is_dir() or (path / "config.pbtxt").is_file():  # a model may be named config.pbtxt
        return False
    folders = [c for c in path.iterdir() if c.is_dir()]
    return (any((c / "config.pbtxt").is_file() for c in folders)
            or bool(folders) and not any(version_number(c.name) is not None for c in folders))
