"""llama-cpp-python's one stateful context on `Llama`: `eval()`, `sample()`, `generate()`,
`reset()`, `n_tokens`, `input_ids`, and `save_state()` / `load_state()` of it.

llama_cpp.Llama holds one llama_context: its tokens (`input_ids[:n_tokens]`) sit in the KV cache,
`eval(tokens)` decodes more, `sample()` draws the next token from the last logits without adding
it, `generate()` does both in a loop and `reset()` forgets the tokens (`n_tokens = 0`). Here the
model runs in the server's slots, so the context is a slot the `Llama` names in each request it
makes for it (`id_slot`: the last slot, until `load_state()` finds it busy and takes another).
Python keeps `input_ids` and `n_tokens` as llama_cpp does, and every call sends the tokens the
context must hold as the prompt, with `cache_prompt`, so the server evaluates only what the slot
does not hold yet. The slot is not reserved: a completion call may take it when it is the one
free, and a request in it is parked like any other when the pool fills; the next context call then
evaluates again what the slot lost (or finds it in the prompt cache). No answer depends on the
cache. `create_completion` and `create_chat_completion` keep a slot per call, as before, and leave
the context as it was.

The server keeps no logits, so `scores` and `eval_logits` are refused, saying what gives
probabilities instead. As llama_cpp's context, it is used by one thread at a time.
"""
from __future__ import annotations

import collections
import contextlib
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, Iterator, Sequence

import numpy as np

from . import llama_state
from .checks import FieldValueError
from .errors import RequestError
from .grammar import grammar_fields
from .llama_state import LlamaState
from .llamacpp_api import LlamaCalls, SeedChain, refuse_callables

if TYPE_CHECKING:
    from .engine import Engine

_NO_LOGITS = ("{what}: the server samples in C++ and keeps no logits; sample() draws the next token from them, "
              "and create_completion(prompt, logprobs=N, max_tokens=1) gives the N most likely next tokens with "
              "their log-probabilities")


@dataclass(frozen=True)
class Sampling:
    """llama_cpp's sample() / generate() keywords (with their defaults), as a /completion request's
    sampling fields. `logit_bias` ({token id: bias}) is ours: llama_cpp biases through a
    logits_processor, which cannot run in the server."""

    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    temp: float = 0.80
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    tfs_z: float = 1.0
    mirostat_mode: int = 0
    mirostat_eta: float = 0.1
    mirostat_tau: float = 5.0
    penalize_nl: bool = True  # taken and unused, as in llama_cpp 0.3 (its sampler ignores it)
    grammar: Any = None
    logit_bias: dict[int, float] | None = None

    def fields(self, where: str, engine: "Engine", seed: int | None) -> dict[str, Any]:
        """The request's sampling fields, checked by the server's rules (a TypeError / ValueError
        naming the keyword as the caller wrote it)."""
        body: dict[str, Any] = {
            "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p, "typical_p": self.typical_p,
            "temperature": self.temp, "repeat_penalty": self.repeat_penalty,
            "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
            "mirostat": self.mirostat_mode, "mirostat_tau": self.mirostat_tau, "mirostat_eta": self.mirostat_eta,
        }
        if self.logit_bias:
            body["logit_bias"] = [[int(k), float(v)] for k, v in self.logit_bias.items()]
        engine.request_rules().check(where, body, shown={"temperature": "temp", "mirostat": "mirostat_mode"})
        if not isinstance(self.tfs_z, (int, float)) or isinstance(self.tfs_z, bool) or self.tfs_z != 1.0:
            raise ValueError(f"{where}: tfs_z={self.tfs_z!r}: tail-free sampling was removed from llama.cpp; leave it "
                             "at 1.0")
        if self.temp < 0:  # llama_cpp: a negative temperature samples the whole distribution as it is
            body.update(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, mirostat=0)
        body.update(grammar_fields(where, self.grammar))
        if seed is not None:
            body["seed"] = seed
        return body


_CONTEXT_INSTEAD = {"logits_processor": "use logit_bias={token: bias} or grammar= instead",
                    "stopping_criteria": "stop iterating the generator when you have enough (it cancels the request)"}


def refuse_callbacks(where: str, logits_processor: Any = None, stopping_criteria: Any = None) -> None:
    """llama_cpp's Python callbacks, refused saying what the context's calls offer instead."""
    refuse_callables(where, _CONTEXT_INSTEAD, logits_processor=logits_processor, stopping_criteria=stopping_criteria)


def token_ids(where: str, tokens: Any, n_vocab: int) -> list[int]:
    """`tokens` as a list of ints, each a token of the model (a TypeError / ValueError otherwise)."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise TypeError(f"{where}: tokens must be a sequence of token ids (llm.tokenize(b'...')), got "
                        f"{type(tokens).__name__}")
    out: list[int] = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{where}: tokens must be token ids (ints), got {t!r}")
        if not 0 <= int(t) < n_vocab:
            raise ValueError(f"{where}: token {int(t)} is not in the model's vocabulary (0 to {n_vocab - 1})")
        out.append(int(t))
    return out


def is_token_ids(tokens: Any) -> bool:
    """Token ids (llama_cpp's generate), rather than the Engine's list of prompts."""
    if isinstance(tokens, np.ndarray):
        return tokens.ndim == 1
    return isinstance(tokens, (list, tuple)) and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tokens)


class _Stream:
    """A streamed request in the context's slot: the tokens it samples, one after another, each
    sampled after the ones before it were evaluated."""

    def __init__(self, engine: "Engine", body: dict[str, Any]) -> None:
        self.request = engine.submit(path="/completion", body={**body, "stream": True}, stream=True)
        self._chunks = self.request.stream()
        self._queue: collections.deque[int] = collections.deque()
        self.ended = False
        self.cancelled = False

    def next(self) -> int | None:
        """The next token (None once the server stopped: end of sequence, or the context is full)."""
        while not self._queue and not self.ended:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.ended = True
                break
            self._queue.extend(int(t) for t in chunk.get("tokens") or [])
        return self._queue.popleft() if self._queue else None

    def cancel(self) -> None:
        """Stop the request, as a client disconnect does: once its handler has let go, the next
        request of the loop finds the slot free."""
        if not self.cancelled:
            self.cancelled = True
            if not self.request.done():
                self.request.cancel()
            self._chunks.close()


class LlamaContext:
    """The state of a Llama's one context: the slot it names, its tokens (`input_ids[:n_tokens]`,
    an np.intc array of n_ctx entries as llama_cpp keeps it), and the stream a generate() has open."""

    def __init__(self, engine: "Engine", seeds: SeedChain) -> None:
        self.engine = engine
        self.seeds = seeds
        info = engine.model_info()
        slots = engine.request("GET", "/slots")
        self.slot = len(slots) - 1
        # what one slot may hold: the whole pool where it is shared (preemption's unified pool)
        self.n_ctx = int(slots[-1].get("n_ctx") or info["n_ctx"])
        self.n_vocab = int(info["n_vocab"])
        self.input_ids: np.ndarray = np.zeros(self.n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self.stream: _Stream | None = None
        self.stream_owner: object | None = None  # the generate() whose stream it is

    def tokens(self, upto: int | None = None) -> list[int]:
        return [int(t) for t in self.input_ids[:self.n_tokens if upto is None else upto]]

    def append(self, tokens: Sequence[int]) -> None:
        """Put tokens after the context's (the next request evaluates them)."""
        if self.n_tokens + len(tokens) > self.n_ctx:
            raise ValueError(f"the context holds {self.n_tokens} tokens: {len(tokens)} more exceed its n_ctx of "
                             f"{self.n_ctx}; reset() it or set n_tokens lower")
        self.input_ids[self.n_tokens:self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def end_stream(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None
            self.stream_owner = None

    def body(self, prompt: list[int], **fields: Any) -> dict[str, Any]:
        return {"prompt": prompt, "id_slot": self.slot, "cache_prompt": True, "return_tokens": True, **fields}

    def complete(self, where: str, prompt: list[int], n_predict: int, fields: dict[str, Any]) -> dict[str, Any]:
        """One request in the context's slot; the server evaluates what the slot lacks of `prompt`."""
        self.end_stream()
        with _named_errors(where, fields):
            return dict(self.engine.submit(path="/completion",
                                           body=self.body(prompt, n_predict=n_predict, **fields)).result())

    def evaluate(self, where: str, tokens: list[int]) -> dict[str, Any] | None:
        """Evaluate `tokens` after the context's into its slot; None when there is nothing to do."""
        if not tokens:
            return None
        prompt = self.tokens() + tokens
        if len(prompt) > self.n_ctx:
            self.append(tokens)  # the ValueError that says so
        # n_predict 0: the server evaluates the prompt, samples once (greedy: cheapest) and stops, the
        # sampled token not decoded, so the slot holds exactly the prompt
        answer = self.complete(where, prompt, 0, {"temperature": 0.0})
        self.append(tokens)
        return answer

    def sample_at(self, where: str, idx: int, fields: dict[str, Any]) -> int:
        """The token sampled after input_ids[:idx + 1] (the slot evaluates what it lacks, at least
        the last token, whose logits are sampled)."""
        answer = self.complete(where, self.tokens(idx + 1), 1, fields)
        tokens = answer.get("tokens") or []
        if not tokens:
            raise RuntimeError(f"{where}: the server sampled no token (its answer: stop_type "
                               f"{answer.get('stop_type')!r}, truncated {answer.get('truncated')!r})")
        return int(tokens[0])

    def next_streamed(self, where: str, fields: dict[str, Any], owner: object) -> int:
        """The token after the whole context, from `owner`'s open stream (one is started from the
        context's tokens when it has none open, or when the server stopped the last one)."""
        for _ in range(2):
            if self.stream is None or self.stream.cancelled or self.stream_owner is not owner:
                self.end_stream()
                with _named_errors(where, fields):
                    self.stream = _Stream(self.engine, self.body(self.tokens(), n_predict=-1, **fields))
                self.stream_owner = owner
            with _named_errors(where, fields):
                token = self.stream.next()
            if token is not None:
                return token
            self.stream = None  # it stopped (an end of sequence): llama_cpp samples on after it
        raise RuntimeError(f"{where}: the server stopped sampling at {self.n_tokens} tokens of the context's "
                           f"n_ctx {self.n_ctx} (the context is full); reset() it or set n_tokens lower")

    def synced(self, where: str) -> bytes:
        """The slot's state holding exactly the context's tokens (evaluated again where lost)."""
        want = self.tokens()
        for _ in range(3):
            # n_predict 0 with the whole context as the prompt: the slot ends holding just these tokens
            self.complete(where, want, 0, {"temperature": 0.0})
            data = llama_state.read_slot(self.engine, self.slot)
            if llama_state.state_tokens(data) == want:
                return data
        raise RuntimeError(f"{where}: another request kept taking the context's slot {self.slot}; save the state "
                           "when fewer requests run")

    def save(self, where: str) -> LlamaState:
        empty = np.zeros((0, self.n_vocab), dtype=np.single)
        if self.n_tokens == 0:
            return LlamaState(np.zeros(0, dtype=np.intc), empty, 0, b"", 0, self.seeds.seed, self.n_vocab)
        data = self.synced(where)
        return LlamaState(self.input_ids[:self.n_tokens].copy(), empty, self.n_tokens, data, len(data),
                          self.seeds.seed, self.n_vocab)

    def load(self, state: LlamaState) -> None:
        llama_state.check_state(self.engine, state)
        n = int(state.n_tokens)
        ids = np.asarray(state.input_ids, dtype=np.intc)
        if not 0 <= n <= min(len(ids), self.n_ctx):
            raise ValueError(f"load_state(): the state holds {n} tokens, with {len(ids)} input_ids, for a context of "
                             f"{self.n_ctx}")
        self.end_stream()
        if n > 0:
            self.slot = llama_state.write_slot(self.engine, bytes(state.llama_state), prefer=self.slot)
        self.input_ids[:n] = ids[:n]
        self.n_tokens = n
        self.seeds.seed = state.seed


@contextlib.contextmanager
def _named_errors(where: str, fields: dict[str, Any]) -> Iterator[None]:
    """The server's refusal of a grammar as a ValueError naming `grammar=` (still a RequestError)."""
    try:
        yield
    except RequestError as e:
        if e.status == 400 and ({"grammar", "json_schema"} & set(fields)) and "grammar" in e.message.lower():
            raise FieldValueError(f"{where}: grammar= is not one llama.cpp can use ({e.message})") from None
        raise


class ContextCalls(LlamaCalls):
    """llama_cpp.Llama's calls on its one context, over LlamaCalls (see the module's docstring)."""

    @property
    def _context(self) -> LlamaContext:
        ctx = self.__dict__.get("_context_state")
        if ctx is None:
            ctx = self.__dict__["_context_state"] = LlamaContext(self.engine, self._seeds)
        return ctx

    def _used(self, context: bool) -> None:
        """Which the next save_state() saves: the context (True) or the last call's slot."""
        self.__dict__["_context_latest"] = context

    # --- what the context holds ---

    @property
    def n_tokens(self) -> int:
        """How many tokens the context holds (llama_cpp's; set it lower to go back, as llama_cpp)."""
        return self._context.n_tokens

    @n_tokens.setter
    def n_tokens(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"n_tokens must be an int, got {value!r}")
        if not 0 <= int(value) <= self._context.n_ctx:
            raise ValueError(f"n_tokens must be within 0 and n_ctx ({self._context.n_ctx}), got {value}")
        self._context.end_stream()
        self._context.n_tokens = int(value)
        self._used(True)

    @property
    def input_ids(self) -> np.ndarray:
        """The context's tokens as llama_cpp keeps them: an np.intc array of n_ctx entries, of which
        the first n_tokens hold (input_ids[:n_tokens])."""
        return self._context.input_ids

    @input_ids.setter
    def input_ids(self, value: Any) -> None:
        ids = np.asarray(value, dtype=np.intc)
        ctx = self._context
        if ids.ndim != 1 or len(ids) > ctx.n_ctx:
            raise ValueError(f"input_ids must be a 1-d array of at most n_ctx ({ctx.n_ctx}) token ids")
        ctx.end_stream()
        ctx.input_ids[:len(ids)] = ids

    @property
    def _input_ids(self) -> np.ndarray:
        return self._context.input_ids[:self._context.n_tokens]

    @property
    def eval_tokens(self) -> collections.deque[int]:
        return collections.deque(self._context.tokens(), maxlen=self._context.n_ctx)

    @property
    def scores(self) -> Any:
        raise NotImplementedError(_NO_LOGITS.format(what="scores"))

    @property
    def _scores(self) -> Any:
        raise NotImplementedError(_NO_LOGITS.format(what="scores"))

    @property
    def eval_logits(self) -> Any:
        raise NotImplementedError(_NO_LOGITS.format(what="eval_logits"))

    # --- the calls ---

    def reset(self) -> None:
        """llama_cpp.Llama.reset: the context holds no tokens (n_tokens = 0); its slot's cells stay
        for a prompt that starts the same, as llama_cpp's stay until overwritten."""
        self._context.end_stream()
        self._context.n_tokens = 0
        self._used(True)

    def eval(self, tokens: Sequence[int]) -> None:
        """llama_cpp.Llama.eval: evaluate `tokens` after the context's, in its slot (the server
        decodes what the slot does not hold yet), and add them to input_ids."""
        ctx = self._context
        ctx.evaluate("eval()", token_ids("eval()", tokens, ctx.n_vocab))
        self._used(True)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor: Any = None,
               grammar: Any = None, idx: int | None = None, *, logit_bias: dict[int, float] | None = None) -> int:
        """llama_cpp.Llama.sample: a token drawn from the logits after input_ids[:idx + 1] (after
        the whole context by default), not added to it. With the Llama's seed (set_seed, seed=),
        as llama_cpp samples. The server's repeat penalties count the context's tokens too
        (llama_cpp's only those its sampler drew); the defaults penalise nothing."""
        where = "sample()"
        refuse_callbacks(where, logits_processor)
        ctx = self._context
        if ctx.n_tokens == 0:
            raise ValueError(f"{where}: the context holds no tokens; eval() the prompt first")
        at = ctx.n_tokens - 1 if idx is None else idx
        if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not 0 <= at < ctx.n_tokens:
            raise ValueError(f"{where}: idx must be a position of the context (0 to {ctx.n_tokens - 1}), got {idx!r}")
        fields = Sampling(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty, presence_penalty,
                          tfs_z, mirostat_mode, mirostat_eta, mirostat_tau, penalize_nl, grammar,
                          logit_bias).fields(where, self.engine, self._seeds.seed)
        token = ctx.sample_at(where, int(at), fields)
        self._used(True)
        return token

    def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        """llama_cpp.Llama.generate(tokens, top_k=, top_p=, temp=, ..., reset=True, grammar=): a
        generator of token ids, each sampled after the ones before it. Given anything but token ids
        (a list of prompts), the Engine's generate(prompts, params) answers, as before."""
        if not is_token_ids(tokens):
            return self.engine.generate(tokens, *args, **kwargs)
        return self._generate(tokens, *args, **kwargs)

    def _generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                  typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                  frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                  mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                  penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                  grammar: Any = None, *, logit_bias: dict[int, float] | None = None
                  ) -> Generator[int, Sequence[int] | None, None]:
        where = "generate()"
        refuse_callbacks(where, logits_processor, stopping_criteria)
        ctx = self._context
        prompt = token_ids(where, tokens, ctx.n_vocab)
        if not isinstance(reset, bool):
            raise TypeError(f"{where}: reset must be True or False, got {reset!r}")
        fields = Sampling(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty, presence_penalty,
                          tfs_z, mirostat_mode, mirostat_eta, mirostat_tau, penalize_nl, grammar,
                          logit_bias).fields(where, self.engine, self._seeds.seed)
        return self._generating(prompt, reset, fields)

    def _generating(self, tokens: list[int], reset: bool, fields: dict[str, Any]
                    ) -> Generator[int, Sequence[int] | None, None]:
        """llama_cpp's generate loop, step for step: its eval() is the next request's prompt, and
        sampling after the whole context is one streamed request for as long as nothing changes it."""
        where = "generate()"
        ctx = self._context
        ctx.end_stream()
        self._used(True)
        me = object()  # this generator: it samples from its own stream only
        if reset and ctx.n_tokens > 0:  # the context's shared start is kept (llama_cpp's prefix match)
            keep = longest_token_prefix(ctx.tokens(), tokens)
            if keep > 0:
                reset = False
                ctx.n_tokens = keep
                tokens = tokens[keep:]
        if reset:
            self.reset()
        ctx.append(tokens)
        if ctx.n_tokens == 0:
            raise ValueError(f"{where}: no tokens to sample after: give a prompt (llm.tokenize(b'...'))")
        sample_idx = ctx.n_tokens - 1
        try:
            while True:
                while sample_idx < ctx.n_tokens:
                    if sample_idx == ctx.n_tokens - 1:
                        token = ctx.next_streamed(where, fields, me)
                    else:  # tokens sent into the generator: each position sampled on its own
                        token = ctx.sample_at(where, sample_idx, fields)
                    sample_idx += 1
                    sent = yield token
                    tokens = [token]
                    if sent is not None:
                        tokens += token_ids(where, sent, ctx.n_vocab)
                        ctx.end_stream()  # the stream has not seen them
                    if sample_idx < ctx.n_tokens and token != ctx.input_ids[sample_idx]:
                        ctx.n_tokens = sample_idx  # the model disagrees with what was sent: drop the rest
                        ctx.end_stream()
                        break
                ctx.append(tokens)  # the stream has taken the token it sampled; the next request evaluates the rest
        finally:
            if ctx.stream_owner is me:
                ctx.end_stream()

    # --- its state ---

    def save_state(self) -> LlamaState:
        """llama_cpp.Llama.save_state: the context's state (its tokens, their cells byte for byte
        and the seed) when the context was used since the last completion call; else, as before,
        the state of the slot that call used (llama_state.py)."""
        if self.__dict__.get("_context_latest"):
            return self._context.save("save_state()")
        return super().save_state()

    def load_state(self, state: LlamaState) -> None:
        """llama_cpp.Llama.load_state: the state's cells go into the context's slot (another idle
        one if that is busy), input_ids and n_tokens become its tokens and the seed its seed, so
        eval()/generate() continue from it and a completion whose prompt starts with its tokens
        reuses its cells."""
        self._context.load(state)
        self._used(True)

    # --- the completion calls keep a slot of their own; save_state() after one saves that slot ---

    @functools.wraps(LlamaCalls.create_completion)
    def create_completion(self, *args: Any, **kwargs: Any) -> Any:
        self._used(False)
        return super().create_completion(*args, **kwargs)

    @functools.wraps(LlamaCalls.create_chat_completion)
    def create_chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        self._used(False)
        return super().create_chat_completion(*args, **kwargs)


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """llama_cpp.Llama.longest_token_prefix: how many tokens a and b share from the start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
