"""Write a synthetic GGUF model shaped like llama.cpp's CI model *stories260K*.

stories260K is a llama2.c model (Karpathy's TinyStories series) that llama.cpp uses in its own
CI. It is small enough to run anywhere, but it is a download; this module builds a file with the
same architecture, hyper-parameters, tensor names and shapes, metadata keys and vocabulary, filled
with seeded random weights, so the server tests can run with no network and no model on disk.

Same as the real file:

* ``llama`` architecture: n_embd 64, 5 blocks, 8 heads, 4 KV heads (head_dim 8), n_ff 172,
  rope dimension count 8, RMS epsilon 1e-5, ``context_length`` 2048 (settable), a separate
  (untied) ``output.weight``, every tensor float32;
* the 512-token SentencePiece vocabulary of llama2.c's ``tok512`` (``tokenizer.ggml.model`` =
  ``llama``): ``<unk>`` (UNKNOWN), ``<s>``/``</s>`` (CONTROL, bos/eos), the 256 byte-fallback
  tokens ``<0x00>``..``<0xFF>`` (BYTE), then the 253 learned pieces (NORMAL) with the same strings
  and descending scores, so any prompt tokenizes to exactly the tokens the real model would give.

Different on purpose: the weights. They are random (so the text is word salad), laid out so that
generation is always well-behaved:

* Residual dimension ``_RESERVED_DIM`` carries a constant: every token embedding has the value
  ``_RESERVED_VALUE`` there, and no block writes to it (those rows of ``attn_output`` and
  ``ffn_down`` are zero), so the final hidden state has that same value there at every position
  and after ``output_norm`` that coordinate is always a large positive number.
* In ``output.weight`` the rows of ids 0..258 (``<unk>``, ``<s>``, ``</s>`` and the byte tokens)
  are ``-_SPECIAL_PENALTY`` on the reserved dimension and zero elsewhere; the rows of the word
  pieces are zero there. Llama has no output bias, this is one: those logits sit tens of units
  below every word piece, so neither greedy nor temperature-1 sampling ever emits an
  end-of-generation token (generation runs to ``n_predict``) or a lone byte (the text stays valid
  UTF-8).

The file is written to a temporary name next to ``path`` and renamed into place, and the same
seed gives a byte-identical file.

CLI: ``python -m llama_preempt.testmodel OUT.gguf [--n-ctx-train N] [--seed S]`` (needs the ``gguf``
package: ``pip install "llama-preempt[standin]"``; it is imported when a model is written, so this
module imports without it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

def _gguf():  # type: ignore[no-untyped-def]
    """The gguf package, imported where a model is written: the rest of llama_preempt never needs it."""
    try:
        import gguf
    except ImportError:
        raise ImportError("writing a GGUF model needs the gguf package: pip install 'llama-preempt[standin]' "
                          "(or pip install gguf)") from None
    return gguf


__all__ = [
    "LLAMA32_1B",
    "SHAPES",
    "SPECIAL_AND_BYTE_IDS",
    "STORIES260K",
    "ModelShape",
    "generate_llama",
    "generate_stories260k",
    "vocab",
]


@dataclass(frozen=True)
class ModelShape:
    """Hyper-parameters of a llama-architecture model."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_rot: int
    rms_eps: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv


#: The real stories260K's hyper-parameters (its GGUF metadata).
STORIES260K = ModelShape(
    n_vocab=512, n_embd=64, n_layer=5, n_head=8, n_head_kv=4, n_ff=172, n_rot=8, rms_eps=1e-5
)

#: Llama-3.2-1B's geometry (16 layers, 8 KV heads of 64: 32 KiB of f16 KV per token) with the tok512
#: vocabulary: for benchmarks where the KV size per token, not the text, decides the costs.
LLAMA32_1B = ModelShape(
    n_vocab=512, n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, n_rot=64, rms_eps=1e-5
)

SHAPES = {"stories260k": STORIES260K, "llama-3.2-1b": LLAMA32_1B}

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
_FIRST_BYTE_ID = 3
_N_BYTES = 256
#: ids 0..258: <unk>, <s>, </s> and <0x00>..<0xFF>; the generated model never samples these.
SPECIAL_AND_BYTE_IDS = range(0, _FIRST_BYTE_ID + _N_BYTES)

# llama.cpp reads a uint32 0xFFFFFFFF as "no such token"; the real file stores it for sep and pad.
_NO_TOKEN = 0xFFFFFFFF

# The 253 learned pieces of llama2.c's tok512 SentencePiece model, ids 259..511, best score first
# (the real stories260K.gguf has exactly these strings at these ids). U+2581 marks a space.
_PIECES: tuple[str, ...] = (
    '▁t', 'he', '▁a', '▁s', '▁w', 'nd', '▁the', 'ed', '▁to', '▁b', '▁and', '▁h', 'in', '▁f',
    '▁wa', '▁T', 'it', 're', 'ou', '▁l', '▁d', '▁c', '▁he', '▁p', 'ay', '▁m', 'er', '▁was', 'om',
    'im', 'on', 'il', '▁The', 'id', 'is', 'at', 'ar', '▁sa', '▁n', '▁g', 'ing', '▁ha', '▁S', 'en',
    'an', 'or', 'le', 'll', '▁L', '▁th', 'ot', 'ily', '▁her', '▁it', '▁"', 'am', 'ir', 'et',
    '▁Lily', '▁u', '▁O', '▁H', '▁On', '▁in', 'ut', '▁pl', 'ri', '▁Tim', 'ow', '▁day', '▁be',
    'ver', 'ce', 'ith', 'ig', '▁o', '▁with', '▁said', '▁play', '▁She', 'pp', 'ck', 'ld', '▁They',
    'my', '▁e', '▁his', '▁He', 'oo', '▁y', '▁st', '▁up', '▁that', '▁r', '▁on', 'ke', 'ked', 'st',
    '▁mom', '▁she', '▁I', 've', 'nt', 'itt', 'very', '▁you', '▁happ', '▁they', 'end', '▁B', 'ime',
    '▁big', '▁fri', 'se', '▁of', '▁friend', 'ittle', '▁little', 'ent', '▁time', 'un', 'ad',
    '▁had', '▁we', '▁there', '▁so', '▁One', 'her', '▁for', 'all', 'ould', '▁nam', '▁want', '▁M',
    '▁happy', '▁saw', '▁named', 'ved', '▁li', '▁but', '▁very', '▁do', '▁lo', 'ch', '▁Once', '▁ne',
    '▁Timmy', 'es', '▁upon', 'out', '▁k', '▁', 'e', 'a', 't', 'o', 'h', 'n', 'i', 'd', 's', 'r',
    'l', 'y', 'm', 'w', 'u', '.', 'p', 'g', 'c', 'b', 'f', ',', 'k', 'T', 'v', '"', 'S', 'L', "'",
    'H', 'O', 'I', '!', 'x', 'B', 'M', 'A', 'W', 'j', '?', 'z', 'Y', 'F', 'J', 'D', 'q', 'C', 'N',
    'E', 'P', 'R', 'K', 'G', '-', '“', '”', ':', '’', 'Z', 'V', 'U', '3', 'Q', ';', '1', '–', '0',
    'X', '2', '5', '—', '‘', '9', '4', 'é', '…', '8', ')', '(', '6', '7', '/', 'ñ', '$', '`', '+',
    '*', '\xa0', '&', '\\', '%', 'â', '€', '<', '>', '|', '™', '[', ']', '~', '\u200a',
)

# Residual-stream layout that keeps special and byte tokens out of every generation (module doc).
_RESERVED_DIM = STORIES260K.n_embd - 1
_RESERVED_VALUE = 2.0
_SPECIAL_PENALTY = 40.0
# Scale of the word-piece rows of output.weight: logits with a spread of a few units, so greedy
# decoding is not flat and temperature 1 is not uniform over the whole vocabulary.
_OUTPUT_GAIN = 2.0


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]


def vocab() -> Vocab:
    """The 512-token tok512 vocabulary: specials, byte fallbacks, then the learned pieces."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [
        int(_gguf().TokenType.UNKNOWN),
        int(_gguf().TokenType.CONTROL),
        int(_gguf().TokenType.CONTROL),
    ]
    scores: list[float] = [0.0, 0.0, 0.0]
    for b in range(_N_BYTES):
        tokens.append(f"<0x{b:02X}>")
        types.append(int(_gguf().TokenType.BYTE))
        scores.append(0.0)
    for rank, piece in enumerate(_PIECES):
        tokens.append(piece)
        types.append(int(_gguf().TokenType.NORMAL))
        scores.append(-float(rank))
    if len(tokens) != STORIES260K.n_vocab or len(set(tokens)) != len(tokens):
        raise AssertionError("tok512 vocabulary must be 512 unique tokens")
    return Vocab(tuple(tokens), tuple(scores), tuple(types))


F32 = npt.NDArray[np.float32]


def _linear(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> F32:
    """A [n_out, n_in] matrix (GGUF ne = [n_in, n_out]) with N(0, gain^2 / n_in) entries."""
    w = rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))
    return w.astype(np.float32)


def _weights(shape: ModelShape, seed: int) -> list[tuple[str, F32]]:
    """All tensors, in the order the real stories260K.gguf stores them."""
    rng = np.random.default_rng(seed)
    d, r = shape.n_embd, _RESERVED_DIM
    ones = np.ones(d, dtype=np.float32)

    token_embd = rng.standard_normal((shape.n_vocab, d)).astype(np.float32)
    token_embd[:, r] = _RESERVED_VALUE

    output = _linear(rng, shape.n_vocab, d, gain=_OUTPUT_GAIN)
    output[:, r] = 0.0
    output[SPECIAL_AND_BYTE_IDS.start : SPECIAL_AND_BYTE_IDS.stop, :] = 0.0
    output[SPECIAL_AND_BYTE_IDS.start : SPECIAL_AND_BYTE_IDS.stop, r] = -_SPECIAL_PENALTY

    tensors: list[tuple[str, F32]] = [
        ("token_embd.weight", token_embd),
        ("output_norm.weight", ones.copy()),
        ("output.weight", output),
    ]
    for i in range(shape.n_layer):
        attn_output = _linear(rng, d, d)
        attn_output[r, :] = 0.0
        ffn_down = _linear(rng, d, shape.n_ff)
        ffn_down[r, :] = 0.0
        tensors += [
            (f"blk.{i}.attn_q.weight", _linear(rng, d, d)),
            (f"blk.{i}.attn_k.weight", _linear(rng, shape.n_embd_kv, d)),
            (f"blk.{i}.attn_v.weight", _linear(rng, shape.n_embd_kv, d)),
            (f"blk.{i}.attn_output.weight", attn_output),
            (f"blk.{i}.attn_norm.weight", ones.copy()),
            (f"blk.{i}.ffn_gate.weight", _linear(rng, shape.n_ff, d)),
            (f"blk.{i}.ffn_down.weight", ffn_down),
            (f"blk.{i}.ffn_up.weight", _linear(rng, shape.n_ff, d)),
            (f"blk.{i}.ffn_norm.weight", ones.copy()),
        ]
    return tensors


def _write(path: pathlib.Path, shape: ModelShape, n_ctx_train: int, seed: int, f16: bool = False,
           name: str = "stories260K-synthetic") -> None:
    voc = vocab()
    w = _gguf().GGUFWriter(str(path), "llama")
    # key order follows the real file (general.architecture is written by the constructor)
    w.add_token_list(list(voc.tokens))
    w.add_token_scores(list(voc.scores))
    w.add_token_types(list(voc.types))
    w.add_tokenizer_model("llama")
    w.add_name(name)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_sep_token_id(_NO_TOKEN)
    w.add_pad_token_id(_NO_TOKEN)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_block_count(shape.n_layer)
    w.add_rope_dimension_count(shape.n_rot)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    for tname, data in _weights(shape, seed):
        # norms stay f32 (llama.cpp expects it); matrices may be f16 to halve a large file
        w.add_tensor(tname, data.astype(np.float16) if f16 and data.ndim == 2 else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def generate_stories260k(
    path: pathlib.Path, *, n_ctx_train: int = 2048, seed: int = 260
) -> pathlib.Path:
    """Write a stories260K-shaped llama GGUF with seeded random weights to *path*; return it.

    The file appears atomically (temporary file in the same folder, then a rename) and is
    byte-identical for the same ``n_ctx_train`` and ``seed``.
    """
    if n_ctx_train < 1:
        raise ValueError(f"n_ctx_train must be positive, got {n_ctx_train}")
    return generate_llama(path, STORIES260K, n_ctx_train=n_ctx_train, seed=seed)


def generate_llama(path: pathlib.Path, shape: ModelShape, *, n_ctx_train: int = 2048, seed: int = 260,
                   f16: bool = False) -> pathlib.Path:
    """Write a llama GGUF of any shape with the tok512 vocabulary and seeded random weights (the
    same well-behaved construction as the stories260K stand-in); return it. `f16` stores the
    matrices in f16 (a Llama-3.2-1B shape is 2 GB that way, 4 GB in f32)."""
    if n_ctx_train < 1:
        raise ValueError(f"n_ctx_train must be positive, got {n_ctx_train}")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        name = "stories260K-synthetic" if shape == STORIES260K else f"llama-synthetic-{shape.n_layer}x{shape.n_embd}"
        _write(tmp, shape, n_ctx_train, seed, f16=f16, name=name)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write a synthetic stories260K-shaped GGUF model (seeded random weights)."
    )
    ap.add_argument("out", type=pathlib.Path, help="output .gguf path")
    ap.add_argument("--n-ctx-train", type=int, default=2048, help="llama.context_length")
    ap.add_argument("--seed", type=int, default=260, help="numpy default_rng seed")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="stories260k",
                    help="stories260k (default) or llama-3.2-1b (32 KiB of KV per token, for GPU benchmarks)")
    ap.add_argument("--f16", action="store_true", help="store the matrices in f16")
    args = ap.parse_args(argv)
    out = generate_llama(args.out, SHAPES[args.shape], n_ctx_train=args.n_ctx_train, seed=args.seed, f16=args.f16)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
