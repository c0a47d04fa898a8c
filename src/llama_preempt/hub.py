"""Model files already in the local Hugging Face hub cache, for `Llama.from_pretrained`: found
where huggingface_hub keeps them, with no network and without huggingface_hub itself.

The cache's layout (huggingface_hub's): `$HF_HUB_CACHE` (or `$HUGGINGFACE_HUB_CACHE`, or
`$HF_HOME/hub`, or `$XDG_CACHE_HOME/huggingface/hub`, or `~/.cache/huggingface/hub`) holds
`models--{org}--{name}/refs/main` (the commit `main` names) and
`models--{org}--{name}/snapshots/{commit}/{path in the repository}`.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path


class NotInHubCache(FileNotFoundError):
    """The file asked for is not in the local hub cache (nothing is downloaded)."""


def hub_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The hub cache huggingface_hub would use: `cache_dir` when given, else its environment's."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


@dataclass(frozen=True)
class HubSnapshot:
    """One repository's files as the cache holds them at the commit `main` names."""

    repo_id: str
    root: Path          # models--{org}--{name}/snapshots/{commit}, or a local_dir
    looked_in: Path     # what an error names as the place looked in
    missing: str = ""   # why nothing is held there, when the cache has no such repository or revision

    def files(self) -> list[str]:
        """The files held, as paths inside the repository ('/'-separated)."""
        if not self.root.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                      if p.is_file() and ".cache" not in p.relative_to(self.root).parts)

    def find(self, pattern: str, what: str = "filename") -> Path:
        """The one file matching `pattern` (a name or a glob, matched as llama_cpp matches it
        against the repository's paths); NotInHubCache when none is held, ValueError when several."""
        held = [] if self.missing else self.files()
        matches = [f for f in held if fnmatch.fnmatch(f, pattern)]
        if len(matches) > 1:
            raise ValueError(f"from_pretrained(): {what}={pattern!r} matches {len(matches)} files of {self.repo_id} in "
                             f"{self.looked_in}: {', '.join(matches)}; give one of them")
        if not matches:
            raise NotInHubCache(
                f"from_pretrained(): {what}={pattern!r} of {self.repo_id} is not in the local Hugging Face cache "
                f"(looked in {self.looked_in}: {self.missing or ('it holds ' + ', '.join(held) if held else 'no files')}); "
                f"nothing is downloaded here: download it once (huggingface-cli download {self.repo_id} "
                f"{pattern!r}) or load the file itself with Llama(model_path=PATH)")
        return self.root / matches[0]


def hub_snapshot(repo_id: str, cache_dir: str | os.PathLike[str] | None = None,
                 local_dir: str | os.PathLike[str] | None = None) -> HubSnapshot:
    """The files of `repo_id` held locally: in `local_dir` when given (huggingface_hub's download
    folder), else in the hub cache at the commit `refs/main` names."""
    if not isinstance(repo_id, str) or repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise ValueError(f"from_pretrained(): repo_id must be 'org/name' (or 'name'), got {repo_id!r}")
    if local_dir is not None:
        root = Path(local_dir).expanduser()
        return HubSnapshot(repo_id, root, root)
    repo = hub_cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    try:
        commit = ref.read_text().strip()
    except OSError:
        why = "no refs/main there" if repo.is_dir() else "no such repository there"
        return HubSnapshot(repo_id, repo / "snapshots", repo, why)
    return HubSnapshot(repo_id, repo / "snapshots" / commit, repo / "snapshots" / commit)
