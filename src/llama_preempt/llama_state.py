"""llama-cpp-python's `save_state()` / `load_state()` over the Engine's slots.

llama_cpp.Llama has one context, so its state is that context's tokens and KV. On a `Llama` that
context is a slot of its own once a context call used it (llama_context.py: eval, sample,
generate, reset, load_state); after a completion call, and on an Engine or `LLM`, the context a
llama-cpp-python program means is the slot of its most recent request (the one its next call
continues). `save_state()` copies the slot's sequence state, byte for byte, as llama.cpp writes it
(`llama_state_seq_save_file`: the tokens, then every layer's cells of the sequence, the same state
a swap park copies, followed by the server's check trailer: its length, checksum and model) into a
`LlamaState` in memory; `load_state()` writes it back into an idle slot,
so the next call whose prompt starts with those tokens takes up the answer from there, as if
nothing had been saved. The copy goes through the server's slot files (`/slots/N?action=save|restore`,
`read_slot` and `write_slot` here) in a directory the Engine's `Llama` made for it
(`--slot-save-path`), and is read back and deleted at once."""
from __future__ import annotations

import contextlib
import os
import struct
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

if TYPE_CHECKING:
    from .engine import Engine

_SEQ_MAGIC = 0x67677371  # LLAMA_STATE_SEQ_MAGIC, 'ggsq'
_TOKEN_NULL = 0xFFFFFFFF  # LLAMA_TOKEN_NULL: the server's packed tokens start with it (then a version, a count)


@dataclass
class LlamaState:
    """llama_cpp.LlamaState's fields: `input_ids` (the tokens the state holds), `scores` (the
    logits llama_cpp keeps per token; the server keeps none, so it has no rows), `n_tokens`,
    `llama_state` (the bytes) and `llama_state_size`, and the `seed` the calls after it draw from.
    It pickles, so a state can be kept on disk and loaded into another Engine of the same model."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int | None
    n_vocab: int = field(default=0, repr=False)


def state_tokens(data: bytes) -> list[int]:
    """The tokens a sequence-state file holds (its header: magic, version, count, then the
    server's packed tokens: a plain list, or LLAMA_TOKEN_NULL, a version, a count and the list)."""
    if len(data) < 12:
        raise ValueError(f"load_state(): a state of {len(data)} bytes is not a llama.cpp sequence state")
    magic, _version, n_packed = struct.unpack_from("<III", data, 0)
    if magic != _SEQ_MAGIC:
        raise ValueError("load_state(): the state's bytes are not a llama.cpp sequence state (no 'ggsq' magic)")
    packed = struct.unpack_from(f"<{n_packed}I", data, 12)
    if packed and packed[0] == _TOKEN_NULL:
        count = packed[2]
        return [int(t) for t in packed[3:3 + count]]
    return [int(t) for t in packed]


def save_dir_of(engine: "Engine") -> str:
    """Where the Engine's server writes slot files (its --slot-save-path)."""
    args = list(engine.args)
    if "--slot-save-path" in args and args.index("--slot-save-path") + 1 < len(args):
        return args[args.index("--slot-save-path") + 1]
    raise RuntimeError("save_state()/load_state() copy a slot's state through the server's slot files: start the "
                       "Engine with args=['--slot-save-path', DIR] (Llama() does so by itself)")


@contextlib.contextmanager
def _slot_file(directory: str) -> Iterator[tuple[str, str]]:
    """A fresh slot-file name in the server's directory (name, path), removed afterwards."""
    name = f"llama-state-{uuid.uuid4().hex}.bin"
    path = os.path.join(directory, name)
    try:
        yield name, path
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _context_slot(slots: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The slot of the most recent request: task ids grow, so it holds the highest."""
    used = [s for s in slots if s.get("id_task") is not None]
    return max(used, key=lambda s: int(s["id_task"])) if used else None


def read_slot(engine: "Engine", slot: int) -> bytes:
    """Slot `slot`'s slot file: its sequence state as llama.cpp writes it (its tokens, then its cells)
    and the server's check trailer, which the server checks again when the bytes are loaded."""
    with _slot_file(save_dir_of(engine)) as (name, path):
        engine.request("POST", f"/slots/{slot}?action=save", {"filename": name})
        with open(path, "rb") as f:
            return f.read()


def write_slot(engine: "Engine", data: bytes, prefer: int | None = None) -> int:
    """Write a sequence state into an idle slot (`prefer` when it is idle, else the one of the most
    recent request, else the first idle); returns the slot's id."""
    directory = save_dir_of(engine)
    state_tokens(data)  # a clear error before the server reads it
    idle: list[dict[str, Any]] = []
    for _ in range(3):  # asked of the loop: each answer comes a step later, a cancelled request's slot freed
        idle = [s for s in engine.request("GET", "/slots") if not s.get("is_processing") and not s.get("is_preempted")]
        if any(s["id"] == prefer for s in idle) or (prefer is None and idle):
            break
    if not idle:
        raise RuntimeError("load_state(): every slot is busy; load the state when a request has finished")
    preferred = [s for s in idle if s["id"] == prefer]
    target = preferred[0] if preferred else (_context_slot(idle) or idle[0])
    with _slot_file(directory) as (name, path):
        with open(path, "wb") as f:
            f.write(data)
        engine.request("POST", f"/slots/{target['id']}?action=restore", {"filename": name})
    return int(target["id"])


def check_state(engine: "Engine", state: LlamaState) -> None:
    """A TypeError / ValueError, saying what is wrong, for what is not a state of this model."""
    save_dir_of(engine)
    for name in ("llama_state", "llama_state_size", "n_tokens"):
        if not hasattr(state, name):
            raise TypeError(f"load_state(): expected a LlamaState (from save_state()), got {type(state).__name__}")
    if not isinstance(state.llama_state, (bytes, bytearray)) or len(state.llama_state) != state.llama_state_size:
        raise ValueError("load_state(): llama_state must be the llama_state_size bytes save_state() returned")
    n_vocab = int(engine.model_info()["n_vocab"])
    if getattr(state, "n_vocab", 0) not in (0, n_vocab):
        raise ValueError(f"load_state(): the state is of a model with {state.n_vocab} tokens in its vocabulary, "
                         f"this one has {n_vocab}: load it into an Engine of the same model")
    if state.n_tokens:
        state_tokens(bytes(state.llama_state))


def save_state(engine: "Engine", seed: int | None) -> LlamaState:
    """The state of the slot the last request used (an empty state before any request)."""
    save_dir_of(engine)
    n_vocab = int(engine.model_info()["n_vocab"])
    empty_scores = np.zeros((0, n_vocab), dtype=np.single)
    slot = _context_slot(engine.slots())
    if slot is None:
        return LlamaState(np.zeros(0, dtype=np.intc), empty_scores, 0, b"", 0, seed, n_vocab)
    data = read_slot(engine, int(slot["id"]))
    tokens = state_tokens(data)
    return LlamaState(np.asarray(tokens, dtype=np.intc), empty_scores, len(tokens), data, len(data), seed, n_vocab)


def load_state(engine: "Engine", state: LlamaState) -> None:
    """Write `state` into an idle slot (the one of the most recent request when it is idle), so
    the next request whose prompt starts with its tokens continues from its cells."""
    check_state(engine, state)
    if state.n_tokens:
        write_slot(engine, bytes(state.llama_state))
