"""A pytest plugin that runs llama.cpp's own server tests (tools/server/tests/unit) against our
llama-server, offline, without editing their files.

- `ServerPreset.load_all()` (which downloads every preset model) does nothing;
- a server asked for the stories260K test model from Hugging Face gets the local file
  ($LLAMA_PREEMPT_UPSTREAM_MODEL) instead; a server that needs any other model, a model URL, an
  mmproj or a draft model from the network skips its test, saying which; so does `download_file`;
- the test process itself never talks to anything but loopback: a request elsewhere skips the
  test instead of going out;
- tests listed in SKIPS (those that would make the server itself fetch from the network, or that
  need what this build or machine does not have) skip with their reason before they run.

Run it with tests/upstream/run.py; tests/upstream/README.md lists what is skipped and why.
"""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import pytest

# the stories260K references of upstream's harness (the same llama2.c model, one file)
STORIES = {("ggml-org/models", "tinyllamas/stories260K.gguf"), ("ggml-org/test-model-stories260K", None)}

LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}

# a test node id (a whole file when it ends in .py; parametrized variants included) -> why it is
# not run here
SKIPS: dict[str, str] = {
    "unit/test_router.py":
        "router mode serves the models that ServerPreset.load_all() downloads into the Hugging Face cache; "
        "this run is offline",
    "unit/test_stream.py":
        "resumable streams are tested through router mode with ggml-org/tinygemma3-GGUF from Hugging Face; "
        "this run is offline",
    "unit/test_vision_api.py":
        "needs ggml-org/tinygemma3-GGUF and its mmproj from Hugging Face, and the server fetches images by URL",
    "unit/test_proxy.py::test_mcp_proxy":
        "makes the server fetch http://example.com through the CORS proxy; this run reaches loopback only",
    "unit/test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry":
        "asserts the stream of an answer cut short by max_output_tokens ends with response.completed; like OpenAI, "
        "this server ends it with response.incomplete (patch 0017-openai-shapes; tests/test_openai_shapes.py "
        "checks the same telemetry on that event)",
    "unit/test_slot_save.py::test_slot_restore_legacy_token_list":
        "edits a saved slot file by hand (its tokens rewritten as a plain list) and restores it; this server "
        "restores only files whose check trailer matches their bytes and model (patch 0019-slot-files; "
        "tests/test_slot_files.py), so the edited file is a 400",
    "unit/test_tools_builtin.py::test_tools_builtin_grep_search":
        "grep_search skips git-ignored files by design, and our repository git-ignores the vendored tree "
        "this test searches",
}
if os.environ.get("LLAMA_PREEMPT_UPSTREAM_UI") == "0":  # a build without npm has no web UI (see /props)
    SKIPS["unit/test_basic.py::test_no_ui"] = "this build has no web UI (npm was not there): GET / is 404"
    SKIPS["unit/test_security.py::test_access_static_assets_without_api_key"] = \
        "this build has no web UI (npm was not there), so there are no static assets"


def _skip_reason(nodeid: str) -> str | None:
    for key, reason in SKIPS.items():
        if nodeid == key or nodeid.startswith(key + "[") or (key.endswith(".py") and nodeid.startswith(key + "::")):
            return reason
    return None


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


def _loopback_only(orig: Any) -> Any:
    def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        host = urlsplit(url).hostname or ""
        if host not in LOOPBACK:
            pytest.skip(f"would fetch {url} from the network; this run reaches loopback only")
        return orig(self, method, url, *args, **kwargs)

    return request


def pytest_configure(config: pytest.Config) -> None:
    import requests

    import utils  # upstream's harness (tools/server/tests/utils.py), on sys.path via their rootdir

    utils.ServerPreset.load_all = staticmethod(lambda: None)
    utils.ServerProcess.start = _offline_start(utils.ServerProcess.start)
    utils.download_file = _offline_download  # test modules take it with `from utils import *`
    requests.Session.request = _loopback_only(requests.Session.request)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = _skip_reason(item.nodeid)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
