#!/usr/bin/env python3
"""Regenerate the whole patch series, one patch per topic, from edits made in vendor/llama.cpp.

    python vendor/mkseries.py            # rewrite patches/*.patch from vendor/llama.cpp
    python vendor/mkseries.py --check    # only say whether patches/ matches vendor/llama.cpp

Edit the fetched tree (vendor/llama.cpp), then run this: it diffs every file of the tree that
differs from the pristine one (a new file: name it with --file), sorts each hunk into its topic by the
rules in TOPICS, and writes one patch per topic, each the diff from the tree with the earlier
topics applied. The series applies in order to the pristine tree and ends at vendor/llama.cpp
exactly. Hunks are independent (diff merges hunks whose context would overlap), so any hunk can
go to any topic; a rule that sends a hunk before the hunk it builds on shows up as a patch that
does not compile on its own, never as one that does not apply.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch  # noqa: E402


@dataclass(frozen=True)
class Topic:
    name: str
    about: str
    takes: Callable[[str, str], bool]  # (file, hunk text) -> belongs here


def _changed(hunk: str) -> str:
    """The lines a hunk adds or removes (rules look at these, not at upstream's context)."""
    return "\n".join(line for line in hunk.splitlines()[1:] if line[:1] in "+-")


def _in(*words: str) -> Callable[[str], bool]:
    return lambda text: any(w in _changed(text) for w in words)


def _only_includes(hunk: str) -> bool:
    """A hunk that only adds #include lines: the headers go with the first server topic, so the
    topics after it find them."""
    changed = [line for line in _changed(hunk).splitlines() if line.strip("+- ")]
    return bool(changed) and all(line.startswith("+#include") for line in changed)


_CLIENT_WORDS = _in("preempt-notice.h", "notices", "keepalive", "preempt_slot_action", "SLOT_PARK", "SLOT_UNPARK",
                    "handle_slots_preempt", "unknown_slot_action", "props_json",
                    "preempt_observe_final", "client_json_error", "version_line", "preempt-version.h",
                    "priority", "n_preempt\"", "preempted_ms", "checked_number", "chat_messages_error")
_CLIENT_COMMON = _in("the client's mistake")  # common/ hunks that make a caller's error a 400
_HTTP_LIMITS = _in("preempt-http-limits", "http_limit", "read_deadline", "keep_alive_s", "max_connections",
                   "stall_timeout", "n_threads_max")  # the http-limits topic
_TOOL_CHOICE = _in("tool_choice", "tool-choice", "json_tools", "json-tools", "need_json_format")  # the tool-choice topic
_OPENAI_SHAPES = _in("openai-shapes", "legacy", "usage_sum", "usage->", "usage]", "response_incomplete",
                     "n_cmpl = ")  # the openai-shapes topic
_STATE_FILE_ERRORS = _in("unexpectedly reached end of file", "sequence state file is inconsistent")  # libllama's readers
_SEQ_CELLS = _in("seqs_n_cells")  # libllama: the cells a sequence holds and shares
_PREFIX_SHARE = _in("preempt_link_prefix", "n_linked", "preempt_share_prefix")  # the prefix-share topic
_SLOT_FILES = _in("slot_file", "parse_slot_id", "ERROR_TYPE_CONFLICT", "ERROR_TYPE_INSUFFICIENT_STORAGE")  # the slot-files topic
_ENGINE_WORDS = _in("preempt_note_error", "common_params_parse_ex", "server_prepare_params",
                    "ex_wrapper", "step_report", "preempt-events.h", "preempt_selftest(",
                    "preempt-engine-api.h")

# the leading patches kept as they are by default: attn-own-cells (the 11th) changes lines beside
# batch-invariant's, and attn-own-cells-gather (the 12th) lines of attn-own-cells, which a whole-series
# rewrite would move into one of the two topics. An edit to a kept patch's own lines: --keep fewer
KEEP = 11

_OWN_CELLS = ("kv_runs", "attn_own_cells", "fa_kv_", "float * scratch", "scratch ? scratch", "tile_cells", "seq_block", "kv_own_cells", "llama-kv-cache.h\"", "llama-memory-hybrid.h")  # the words of the attn-own-cells topic

# in order: each hunk goes to the first topic that takes it
TOPICS = [
    Topic("flags", "our flags in upstream's parser (csrc/server/preempt-args.cpp) and their fields in common_params",
          lambda f, t: f.startswith("common/") and not _ENGINE_WORDS(t) and not _CLIENT_COMMON(t)
          and not _in("batch_invariant", "attn_own_cells")(t)),
    Topic("loop-split", "server_queue::start_loop() split into its parts, so a host can run one iteration at a time",
          lambda f, t: (f == "tools/server/server-queue.h" or (f == "tools/server/server-queue.cpp" and "deadline" not in t))
          and "n_waiting" not in t and "peek_deferred" not in t and "wake_waiters" not in t and "result_waiter" not in t),
    Topic("server-hooks", "the hooks of the park/resume mechanics (csrc/server/preempt-hooks.inc) in upstream's server loop",
          lambda f, t: (f in ("tools/server/server-context.cpp", "tools/server/server-common.h", "tools/server/server-task.h",
                              "tools/server/server-task.cpp") or _in("peek_deferred")(t))
          and (_only_includes(t) or (not _CLIENT_WORDS(t) and not _ENGINE_WORDS(t)))),
    Topic("client-surface", "what clients and operators see: notices, priority, the slot API, /props, errors, timings",
          lambda f, t: (f.startswith("tools/server/") or (f.startswith("common/") and _CLIENT_COMMON(t))) and not _ENGINE_WORDS(t)
          and "result_waiter" not in t),
    Topic("results-wake-one", "server_response: a result wakes the one handler waiting for it, not every handler "
          "(with many streams the shared wakeups took most of the loop's time; could go upstream alone)",
          lambda f, t: f.startswith("tools/server/server-queue.") and "result_waiter" in t),
    Topic("engine", "what the in-process Engine calls instead of copying: step(), the parser, parameter finalisation",
          lambda f, t: f.startswith("tools/server/") or (f.startswith("common/") and not _in("batch_invariant", "attn_own_cells")(t))),
    Topic("state-seq-bulk-copy", "libllama: a sequence state's slices handed to a callback in bulk (could go upstream alone)",
          lambda f, t: (f.startswith("include/") or f.startswith("src/")) and not _in("batch_invariant", "kv_order", *_OWN_CELLS)(t)),
    Topic("rpc-supports-op", "ggml-rpc: the client asks the remote device whether it runs an op (cached; protocol 7.1), so "
          "an op the device lacks stays local instead of aborting the server (could go upstream alone)",
          lambda f, t: f in ("ggml/src/ggml-rpc/ggml-rpc.cpp", "ggml/include/ggml-rpc.h")
          and _in("supports_op", "SUPPORTS_OP", "server_minor", "MINOR_VERSION")(t)),
    Topic("rpc-graph-reuse-after-free", "ggml-rpc: the client sends its graph again after a buffer free (fixes a crash)",
          lambda f, t: f == "ggml/src/ggml-rpc/ggml-rpc.cpp"),
    Topic("batch-invariant", "ggml-cpu and libllama: batch-invariant kernels and a KV visiting order, so a sequence's "
          "logits do not depend on its batch or neighbours (could go upstream alone)",
          lambda f, t: (f.startswith("ggml/") or _in("batch_invariant", "kv_order")(t)) and not _in(*_OWN_CELLS)(t)),
    Topic("attn-own-cells", "ggml-cpu and libllama: flash attention over a pool shared by many sequences visits only each "
          "row's own cells (runs of cells built once per ubatch), so one pool costs what a static split does "
          "(could go upstream alone)",
          lambda f, t: f.startswith(("ggml/", "src/", "include/", "common/", "tests/")) and _in(*_OWN_CELLS)(t)),
    Topic("attn-own-cells-gather", "libllama: where no kernel walks the runs (no flash attention, or the KV on a device "
          "other than the CPU), attention gathers each sequence's cells into a stream of its own, so a row multiplies "
          "only its own cells (could go upstream with attn-own-cells)",
          lambda f, t: f.startswith(("ggml/", "src/", "include/", "tests/")) and not _STATE_FILE_ERRORS(t)
          and not _SEQ_CELLS(t)),
    Topic("ids-probabilities", "server: a caller of the token ids (return_tokens) gets one probability per id: a stop "
          "string's tokens keep theirs, and a token that ends inside a UTF-8 character gets its own",
          lambda f, t: f == "tools/server/server-context.cpp" and _in("caller of the ids")(t)),
    Topic("body-limit", "server: the largest request body is a flag (--max-body-mib, 413 naming it), and a prompt "
          "that cannot fit the context is refused before it is tokenized",
          lambda f, t: f.startswith(("tools/server/", "common/")) and not _TOOL_CHOICE(t) and not _HTTP_LIMITS(t)
          and not _OPENAI_SHAPES(t) and not _SLOT_FILES(t) and not _PREFIX_SHARE(t)),
    Topic("tool-choice", "common and server: tool_choice in every form OpenAI defines (a named function is a required "
          "call among the tools narrowed to it; a bad one is a 400), and a required call where the template has no "
          "tool format gets generic JSON tool calls by grammar (could go upstream alone)",
          lambda f, t: f.startswith(("tools/server/", "common/")) and not _HTTP_LIMITS(t) and not _OPENAI_SHAPES(t)
          and not _SLOT_FILES(t) and not _PREFIX_SHARE(t)),
    Topic("http-limits", "cpp-httplib and server: every connection bounded: a request's headers and body within a "
          "deadline, a cap on open connections refused at once, a write with no progress ends its response, the "
          "pool spawns a thread whenever its idle ones cannot take every queued connection (could go upstream alone)",
          lambda f, t: f.startswith(("vendor/cpp-httplib/", "tools/server/", "common/")) and not _OPENAI_SHAPES(t)
          and not _SLOT_FILES(t) and not _PREFIX_SHARE(t)),
    Topic("openai-shapes", "server: OpenAI's shapes where upstream's OpenAI routes answer in their own: /v1/completions' "
          "echo and legacy logprobs (tokens, token_logprobs, top_logprobs, text_offset), usage summed over n choices "
          "(each prompt once), and a Responses answer cut short by max_output_tokens incomplete",
          lambda f, t: f.startswith("tools/server/") and _OPENAI_SHAPES(t)),
    Topic("state-file-errors", "libllama: a sequence-state file cut short or inconsistent is an error its loader returns "
          "(0, logged), not an assert that ends the process: the buffered reader no longer reads past a file's end "
          "silently, as the Windows reader already refuses to (could go upstream alone)",
          lambda f, t: f.startswith("src/") and _STATE_FILE_ERRORS(t)),
    Topic("slot-files", "server: the slot API's files written whole (a temporary name, fsync, rename) and checked before "
          "they are read (csrc/server/preempt-slot-file.h); a slot id is digits only, one out of range or a slot parked "
          "through the API is answered at once; 409 and 507 error types",
          lambda f, t: f.startswith("tools/server/") and _SLOT_FILES(t)),
    Topic("seq-cells", "libllama: llama_memory_seqs_n_cells(): in one pass over the cells, how many KV cells hold each "
          "sequence, how many of them another sequence holds too (cells shared through seq_cp: removing it frees the "
          "rest) and how many it is the lowest sequence of (each used cell counted once) (could go upstream alone)",
          lambda f, t: f.startswith(("src/", "include/")) and _SEQ_CELLS(t)),
    Topic("prefix-share", "server: a new prompt links the longest prefix another slot holds in the unified pool "
          "(csrc/server/preempt-prefix.h) before its own cached prefix is counted, with and without cache_prompt; "
          "--prefix-share / --no-prefix-share",
          lambda f, t: f.startswith(("tools/server/", "common/")) and _PREFIX_SHARE(t)),
]


def split_hunks(diff: str) -> list[str]:
    """The hunks of a one-file unified diff (without its --- / +++ header)."""
    hunks: list[str] = []
    for line in diff.splitlines(keepends=True)[2:]:
        if line.startswith("@@"):
            hunks.append(line)
        else:
            hunks[-1] += line
    return hunks


def file_diff(a: Path, b: Path, rel: str) -> str:
    proc = subprocess.run(["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}",
                           str(a) if a.exists() else "/dev/null", str(b)], capture_output=True, text=True)
    if proc.returncode > 1:
        raise SystemExit(proc.stderr)
    return proc.stdout


def touched_files() -> list[str]:
    files: set[str] = set()
    for p in fetch.patch_files():
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                files.add(line[len("+++ b/"):].strip())
    return sorted(files)


def changed_files(pristine: Path) -> set[str]:
    """Every file of the pristine tree that vendor/llama.cpp changed (new files: name them)."""
    out: set[str] = set()
    for a in pristine.rglob("*"):
        if a.is_file():
            rel = a.relative_to(pristine).as_posix()
            b = fetch.TREE / rel
            if not b.exists() or b.read_bytes() != a.read_bytes():
                out.add(rel)
    return out


def build(named: list[str], keep: int = 0) -> dict[str, str]:
    """topic name -> patch text, for the files the series touches, the named ones and every file
    of the tree that differs from the pristine one. The first `keep` patches of patches/ are kept as
    they are: the later topics are the step from the tree with them applied (so a topic whose lines
    sit beside an earlier topic's, or change them, leaves the earlier patch whole)"""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        fetch.extract(fetch.find_sdist(), tree)
        files = sorted(set(named) | changed_files(tree))
        kept = fetch.patch_files()[:keep]
        for topic, p in zip(TOPICS, kept):
            text = p.read_text()
            proc = subprocess.run(["patch", "-p1", "--batch", "--silent", "-d", str(tree)], input=text,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"mkseries: kept {p.name} does not apply:\n{proc.stdout}{proc.stderr}")
            out[topic.name] = text
        # every hunk against that tree, sorted into the topics after the kept ones
        by_topic: dict[str, list[tuple[str, str]]] = {t.name: [] for t in TOPICS[keep:]}
        for rel in files:
            d = file_diff(tree / rel, fetch.TREE / rel, rel)
            for h in split_hunks(d) if d else []:
                topic = next((t for t in TOPICS[keep:] if t.takes(rel, h)), None)
                if topic is None:
                    raise SystemExit(f"mkseries: no topic takes a hunk of {rel}:\n{h}")
                by_topic[topic.name].append((rel, h))
        # apply topic by topic; each patch is the diff of its step
        for i, topic in enumerate(TOPICS):
            if i < keep:
                continue
            hunks = by_topic[topic.name]
            if not hunks:
                continue
            before = Path(tmp) / f"before{i}"
            shutil.copytree(tree, before, symlinks=True)
            for rel in sorted({r for r, _ in hunks}):
                text = f"--- a/{rel}\n+++ b/{rel}\n" + "".join(h for r, h in hunks if r == rel)
                proc = subprocess.run(["patch", "-p1", "--batch", "--silent", "-d", str(tree)], input=text,
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"mkseries: {topic.name}: {rel} does not take its hunks:\n{proc.stdout}{proc.stderr}")
            chunks = [file_diff(before / rel, tree / rel, rel) for rel in sorted({r for r, _ in hunks})]
            out[topic.name] = f"llama-preempt: {topic.about}\n\n" + "".join(chunks)
            shutil.rmtree(before)
        # the last tree must be vendor/llama.cpp
        for rel in files:
            if (tree / rel).read_bytes() != (fetch.TREE / rel).read_bytes():
                raise SystemExit(f"mkseries: {rel} does not end where vendor/llama.cpp is")
    return out


def changed_lines(text: str) -> int:
    return sum(1 for line in text.splitlines()
               if (line.startswith("+") and not line.startswith("+++")) or (line.startswith("-") and not line.startswith("---")))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with patches/ and write nothing")
    ap.add_argument("--file", action="append", default=[], help="a file of the tree to add to the series")
    ap.add_argument("--keep", type=int, default=KEEP, metavar="N",
                    help="keep the first N patches as they are and write the later topics on top of them "
                         f"(default {KEEP}: the patches before attn-own-cells-gather, whose lines sit beside theirs; "
                         "--keep 0 to rewrite a kept topic)")
    args = ap.parse_args(argv)
    series = build(sorted(set(touched_files()) | set(args.file)), args.keep)
    names = {f"{i + 1:04d}-{name}.patch": text for i, (name, text) in enumerate(series.items())}
    if args.check:
        now = {p.name: p.read_text() for p in fetch.patch_files()}
        if now != names:
            print("mkseries: patches/ differs from vendor/llama.cpp (run vendor/mkseries.py)", file=sys.stderr)
            return 1
        print("mkseries: patches/ matches vendor/llama.cpp")
        return 0
    if fetch.current_stamp() != fetch.wanted_stamp():
        print("mkseries: vendor/llama.cpp was not made from patches/ as they are now (a patch was edited by hand, "
              "or the tree is stale): run `python vendor/fetch.py --force`, redo the edits, then this", file=sys.stderr)
        return 1
    for p in fetch.patch_files():
        p.unlink()
    total = 0
    for name, text in names.items():
        (fetch.PATCHES / name).write_text(text)
        total += changed_lines(text)
        print(f"mkseries: {name}: {changed_lines(text)} changed lines")
    print(f"mkseries: {len(names)} patches, {total} changed lines of upstream")
    # the tree is exactly the new series applied (build() checked it): record that, as fetch.py does
    fetch.STAMP.write_text(json.dumps(fetch.wanted_stamp(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
