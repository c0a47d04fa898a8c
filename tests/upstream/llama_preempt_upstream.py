"""A pytest plugin that runs llama.cpp's own server tests (tools/server/tests/unit) against our
llama-server, offline, without editing their files.

- `ServerPreset.load_all()` (which downloads every preset model) does nothing;
- a server asked for the stories260K test model from Hugging Face gets the local file
  ($LLAMA_PREEMPT_UPSTREAM_MODEL) instead; a server that needs any other model, a model URL, an
  mmproj or a draft model from the network skips its test, saying which;
- tests listed in SKIPS skip with their reason (see tests/upstream/README.md).

Run it with tests/upstream/run.py.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

# the stories260K references of upstream's harness (the same llama2.c model, one file)
STORIES = {("ggml-org/models", "tinyllamas/stories260K.gguf"), ("ggml-org/test-model-stories260K", None)}

# nodeid substring -> why it is not run here
SKIPS: dict[str, str] = {}


def _offline_start(orig: Any) -> Any:
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.model_file is None and (self.model_hf_repo, self.model_hf_file) in STORIES:
            self.model_file = os.environ["LLAMA_PREEMPT_UPSTREAM_MODEL"]
            self.model_hf_repo = None
            self.model_hf_file = None
        remote = [f"{k}={v}" for k, v in (("hf-repo", self.model_hf_repo), ("hf-file", self.model_hf_file),
                                          ("model-url", self.model_url), ("mmproj-url", self.mmproj_url))
                  if v]
        if self.model_draft and not os.path.isfile(self.model_draft):
            remote.append(f"model-draft={self.model_draft}")
        if remote:
            pytest.skip(f"needs a model from the network ({', '.join(remote)}); this run is offline")
        return orig(self, *args, **kwargs)

    return start


def _offline_download(url: str, *args: Any, **kwargs: Any) -> str:
    pytest.skip(f"needs {url} from the network; this run is offline")


def pytest_configure(config: pytest.Config) -> None:
    import utils  # upstream's harness (tools/server/tests/utils.py), on sys.path via their rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    utils.ServerProcess.start = _offline_start(utils.ServerProcess.start)
    utils.download_file = _offline_download  # test modules take it with `from utils import *`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for pattern, reason in SKIPS.items():
            if pattern in item.nodeid:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
