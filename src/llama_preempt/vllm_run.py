"""vLLM's requests over the server's: one `VllmRun` per prompt turns a SamplingParams into the
server requests it takes and their streamed chunks into vLLM's RequestOutputs (cumulative, only
what is new, or once at the end: RequestOutputKind), the last one `finished`. LLM.generate runs
them all at once (`generate_sync`), AsyncLLM.generate one at a time (aio.py).

Most of vLLM's fields are one server request's (sampling.py maps them). The rest are done here, each
as close to vLLM's meaning as the server allows:

- `truncate_prompt_tokens=k`: the prompt's last k tokens are sent (token ids); -1: the context's size.
- `bad_words`, `allowed_token_ids`: banned through `logit_bias` (every id outside the allowed ones; each
  bad word's one token, with and without a leading space, as vLLM tokenizes them). vLLM bans a
  word of several tokens only where its first ones were just generated; the server's bias cannot
  look back, so such a word is refused (NotImplementedError) rather than banned everywhere.
- `skip_special_tokens=False`: the special tokens' text is rendered (`preserved_tokens`).
- `stop_token_ids`: the stream is read token by token; at one of them the sequence ends (the id kept
  in token_ids, its text not in the text) and the server request is cancelled once every sequence
  has ended.
- `include_stop_str_in_output`: the stop string the server cut off (`stopping_word`) is put back; a
  stop token's text is kept.
- `min_tokens=m`: two requests: the first m tokens with the end token and the stop ids banned and no
  stop strings (`ignore_eos`, `logit_bias`; vLLM looks for stop strings only after them too), then
  the rest from the prompt and those tokens (the server finds them in its cache). With a seed, the
  second request samples from the seed again, so the tokens after m differ from one request's.
- `prompt_logprobs=k`: the server does not score a prompt, so the prompt is generated again, each
  token forced (a grammar of token ids; a special token, which may be an end token a grammar cannot
  give, by a bias one token at a time) with the top k alternatives: each forced token's reported
  log-probability is the model's own, before any sampler. It costs one decode step per prompt token,
  before the answer's request (which then finds the prompt in the cache).
- `detokenize=False`: the text is empty.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .checks import FieldValueError
from .errors import RequestError
from .outputs import CompletionOutput, Logprob, RequestOutputKind, RequestStateStats, finish_of, logprobs_of, sequence_output
from .prompts import is_prompt
from .reports import Completion
from .sampling import SamplingParams

# every stage's request is streamed with its token ids and the server's timings at each token
_STREAM = {"stream": True, "return_tokens": True, "timings_per_token": True}


class Vocab:
    """What the runs read of a model's vocabulary, once per Engine: its size, context, end token,
    and which ids are special (their text is empty unless rendered as special)."""

    def __init__(self, engine: Any) -> None:
        info = engine.model_info()
        self.n_vocab = int(info["n_vocab"])
        self.n_ctx = int(info["n_ctx"])
        self.eos = int(info["token_eos"])
        self._detok = engine._core.detokenize  # the server's own pieces, joined (no space dropped after a start token)
        self._special: dict[int, bool] = {}
        self._all_special: frozenset[int] | None = None

    def text(self, ids: Sequence[int], special: bool) -> str:
        """The text of these ids as the server writes it (special tokens rendered with `special`)."""
        return bytes(self._detok(list(ids), special)).decode("utf-8", errors="replace")

    def is_special(self, t: int) -> bool:
        got = self._special.get(t)
        if got is None:
            got = self._special[t] = not bytes(self._detok([t], False)) and bool(bytes(self._detok([t], True)))
        return got

    def specials(self) -> frozenset[int]:
        if self._all_special is None:
            self._all_special = frozenset(t for t in range(self.n_vocab) if self.is_special(t))
        return self._all_special


_VOCABS: "weakref.WeakKeyDictionary[Any, Vocab]" = weakref.WeakKeyDictionary()


def vocab_of(engine: Any) -> Vocab:
    v = _VOCABS.get(engine)
    if v is None:
        v = _VOCABS[engine] = Vocab(engine)
    return v


@dataclass(frozen=True)
class Stage:
    """One server request of a run: scoring the prompt (`score`), the first min_tokens (`lead`), or
    the answer (`main`). Chunk index j of its stream is sequence `seqs[j]`; a score stage forces
    the prompt's tokens `span` (positions)."""

    kind: str
    prompt: Any
    fields: dict[str, Any]
    seqs: tuple[int, ...] = (0,)
    span: tuple[int, int] = (0, 0)


@dataclass
class _Seq:
    """One sequence so far: its text (the server's, changed where a rule says), ids and their
    probabilities; `held` chars at the end of the text are not shown yet (a special token's text
    that may turn out to be the end token's); `shown_*`: what DELTA outputs gave out."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    probs: list[dict[str, Any]] = field(default_factory=list)
    finish: str | None = None
    stop_reason: str | int | None = None
    stop_type: str = ""
    held: int = 0
    shown_text: int = 0
    shown_ids: int = 0

    @property
    def visible(self) -> str:
        return self.text[:len(self.text) - self.held]


def _bias_pairs(bias: Any) -> list[list[Any]]:
    """A logit_bias in its list form ([[id or text, bias], ...]), to add bans to."""
    if bias is None:
        return []
    if isinstance(bias, dict):
        return [[int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k, v] for k, v in bias.items()]
    return [list(p) for p in bias]


class VllmRun:
    """One vLLM request: `next_stage()` gives the server request to start (None when it is done),
    `feed(chunk)` takes each chunk of its stream and returns the RequestOutput to give (or None),
    `stage_ended()` is called when that request's stream has ended (it may return the last output);
    `cancel_wanted` says the running request's further tokens are not needed."""

    def __init__(self, engine: Any, prompt: Any, params: SamplingParams, fields: dict[str, Any], request_id: str = "",
                 *, measure: bool = False, where: str = "generate()") -> None:
        self.params = params
        self.request_id = request_id
        self.vocab = vocab = vocab_of(engine)
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = list(engine.tokenize(prompt, special=True))  # as the server tokenizes a text prompt
        elif is_prompt(prompt):
            text, ids = None, [int(t) for t in prompt]
        else:
            raise ValueError(f"{where}: SamplingParams({', '.join(params.vllm_only())}=...) need a text or token-id "
                             "prompt; render chat messages first (LLM.chat does)")
        send: Any = prompt
        keep = params.truncate_prompt_tokens
        if keep is not None:
            keep = vocab.n_ctx if keep == -1 else keep
            if len(ids) > keep:
                ids = ids[-keep:]
                send = ids
        self.prompt_ids = ids
        self.prompt_fields: dict[str, Any] = {"prompt": text, "prompt_token_ids": ids}
        self._send = send
        base = {**params.to_fields(), **fields}
        bans = self._bans(engine, where)
        if bans:
            base["logit_bias"] = _bias_pairs(base.get("logit_bias")) + [[t, False] for t in bans]
        if not params.skip_special_tokens:
            shown = {vocab.text([t], True) for t in vocab.specials()}
            base["preserved_tokens"] = sorted(shown | set(base.get("preserved_tokens") or ()))
        self._base = base
        self.stop_ids = frozenset(int(t) for t in params.stop_token_ids or ())
        for t in self.stop_ids:
            if t >= vocab.n_vocab:
                raise ValueError(f"{where}: stop_token_ids: {t} is not a token id of this model (0 to {vocab.n_vocab - 1})")
        limit = engine.request_rules().fields.get("n_probs")
        if params.prompt_logprobs is not None and limit is not None and limit.hi is not None \
                and params.prompt_logprobs > limit.hi:
            raise FieldValueError(f"{where}: prompt_logprobs={params.prompt_logprobs}: at most {int(limit.hi)} "
                                  "alternatives a token (the server's --max-logprobs)")
        self.seqs = [_Seq() for _ in range(params.n)]
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = None
        self._stages: list[Stage] = self._score_stages() if params.prompt_logprobs is not None else []
        self._scored: list[dict[str, Any]] = []
        self._phase = "score" if self._stages else "answer"
        if params.prompt_logprobs is not None and not self._stages:
            self.prompt_logprobs = [None]  # a prompt of one token: nothing before it to score it by
        self.stage: Stage | None = None
        self.cancel_wanted = False
        self._final_given = False
        self._last_chunk: dict[str, Any] = {}
        self.num_cached_tokens: int | None = None
        self._measure = measure
        self._times = {"arrival": time.time(), "queued": time.monotonic(), "scheduled": 0.0, "first": 0.0, "last": 0.0}

    # --- what is asked of the server ---

    def _bans(self, engine: Any, where: str) -> list[int]:
        """The ids allowed_token_ids and bad_words ban, as vLLM reads them."""
        p, vocab = self.params, self.vocab
        bans: set[int] = set()
        if p.allowed_token_ids:
            allowed = {int(t) for t in p.allowed_token_ids}
            outside = [t for t in allowed if t >= vocab.n_vocab]
            if outside:
                raise ValueError(f"{where}: allowed_token_ids: {outside} are not token ids of this model "
                                 f"(0 to {vocab.n_vocab - 1})")
            bans.update(t for t in range(vocab.n_vocab) if t not in allowed)
        for word in p.bad_words or ():
            # vLLM: the word as written (its leading spaces stripped), and with one leading space where
            # that makes the same number of tokens with another first one
            plain = list(engine.tokenize(word.lstrip(), add_bos=False))
            if not plain:
                raise ValueError(f"{where}: bad_words: {word!r} makes no token")
            variants = [plain]
            spaced = list(engine.tokenize(" " + word.lstrip(), add_bos=False))
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                variants.append(spaced)
            for ids in variants:
                if len(ids) > 1:
                    raise NotImplementedError(
                        f"{where}: bad_words: {word!r} is {len(ids)} tokens here ({ids}); vLLM bans its last token "
                        "only right after the others, which the server's logit_bias cannot do (it bans a token "
                        "everywhere). Give words of one token, or ban tokens with logit_bias={id: -100} or keep "
                        "them out with a grammar")
                bans.add(ids[0])
        return sorted(bans)

    def _score_stages(self) -> list[Stage]:
        """The requests that score the prompt: runs of ordinary tokens forced by a grammar of their
        ids, a special token alone by a bias (a grammar cannot give an end token)."""
        ids, k = self.prompt_ids, int(self.params.prompt_logprobs or 0)
        common: dict[str, Any] = {"n_probs": max(1, k), "temperature": 0, **_STREAM}
        if "priority" in self._base:
            common["priority"] = self._base["priority"]
        stages, i = [], 1
        while i < len(ids):
            if self.vocab.is_special(ids[i]):
                stages.append(Stage("score", ids[:i], {**common, "n_predict": 1, "logit_bias": [[ids[i], 1e9]]},
                                    span=(i, i + 1)))
                i += 1
                continue
            j = i
            while j < len(ids) and not self.vocab.is_special(ids[j]):
                j += 1
            grammar = "root ::= " + " ".join(f"<[{t}]>" for t in ids[i:j])
            stages.append(Stage("score", ids[:i], {**common, "n_predict": j - i, "grammar": grammar}, span=(i, j)))
            i = j
        return stages

    def _answer_stage(self) -> Stage | None:
        p = self.params
        n = len(self.seqs)
        if self._phase == "answer":
            if p.min_tokens > 0:
                self._phase = "lead"
                f = {k: v for k, v in self._base.items() if k != "stop"}
                f.update(n_predict=p.min_tokens, ignore_eos=True)
                if self.stop_ids:
                    f["logit_bias"] = _bias_pairs(f.get("logit_bias")) + [[t, False] for t in sorted(self.stop_ids)]
                return Stage("lead", self._send, {**f, **_STREAM}, seqs=tuple(range(n)))
            self._phase = "main"
            return Stage("main", self._send, {**self._base, **_STREAM}, seqs=tuple(range(n)))
        if self._phase == "lead":
            self._phase = "main"
            going = tuple(i for i, s in enumerate(self.seqs) if s.finish is None)
            if not going:
                return None
            f = {k: v for k, v in self._base.items() if k != "n_cmpl"}
            f["n_predict"] = -1 if p.max_tokens in (None, -1) else p.max_tokens - p.min_tokens
            prompts = [self.prompt_ids + self.seqs[i].ids for i in going]
            return Stage("main", prompts if len(prompts) > 1 else prompts[0], {**f, **_STREAM}, seqs=going)
        return None

    def next_stage(self) -> Stage | None:
        """The next server request to start, or None when the run is done."""
        if self._stages:
            self.stage = self._stages.pop(0)
        elif self.done or self._phase == "main":
            self.stage = None
        else:
            self.stage = self._answer_stage()
        self.cancel_wanted = False
        return self.stage

    # --- what the server answers ---

    @property
    def done(self) -> bool:
        return self._phase != "score" and all(s.finish is not None for s in self.seqs)

    def feed(self, chunk: dict[str, Any]) -> Completion | None:
        """One chunk of the running stage's stream; the output to give for it (None: nothing yet)."""
        st = self.stage
        if st is None:
            return None
        if st.kind == "score":
            self._scored.extend(chunk.get("completion_probabilities") or [])
            return None
        self._last_chunk = chunk
        i = st.seqs[int(chunk.get("index", 0) or 0) % len(st.seqs)]
        s = self.seqs[i]
        if s.finish is not None:  # ended here at a stop id; the server goes on until cancelled
            return None
        new_ids = [int(t) for t in chunk.get("tokens") or []]
        self._note_times(chunk, i, bool(new_ids))
        cut = next((k for k, t in enumerate(new_ids) if t in self.stop_ids), None)
        if cut is not None:
            self._end_at_stop_id(s, new_ids[:cut + 1], (chunk.get("completion_probabilities") or [])[:cut + 1])
        else:
            self._add(s, st, chunk, new_ids)
        # ended here at a stop id, the server would go on: its request is cancelled once every sequence has ended
        self.cancel_wanted = self.done and any(q.stop_type == "token" for q in self.seqs)
        return self._output(i)

    def _add(self, s: _Seq, st: Stage, chunk: dict[str, Any], new_ids: list[int]) -> None:
        p = self.params
        s.ids += new_ids
        s.probs += chunk.get("completion_probabilities") or []
        new_text = chunk.get("content", "") or ""
        s.text += new_text
        if new_ids or new_text:
            s.held = 0
        if not p.skip_special_tokens and new_ids and self.vocab.is_special(new_ids[-1]):
            piece = self.vocab.text([new_ids[-1]], True)
            if piece and s.text.endswith(piece):
                s.held = len(piece)  # shown with the next token, or dropped if it ended the sequence
        if not chunk.get("stop"):
            return
        stop_type = str(chunk.get("stop_type") or "")
        if st.kind == "lead" and stop_type == "limit" and len(s.ids) >= p.min_tokens \
                and (p.max_tokens in (None, -1) or p.max_tokens > p.min_tokens):
            return  # the rest comes in the main stage
        reason, word = finish_of(chunk)
        s.finish, s.stop_reason, s.stop_type = reason or "stop", word, stop_type
        if stop_type == "eos" and s.held and not p.include_stop_str_in_output:
            s.text = s.text[:-s.held]  # vLLM leaves the end token's text out
        elif stop_type == "word" and word and p.include_stop_str_in_output:
            s.text += word
        s.held = 0

    def _end_at_stop_id(self, s: _Seq, ids: list[int], probs: list[dict[str, Any]]) -> None:
        """The sequence ends at a stop_token_id: the id kept, its text only with include_stop_str_in_output."""
        s.ids += ids
        s.probs += probs
        tid = ids[-1]
        shown = s.ids if self.params.include_stop_str_in_output else s.ids[:-1]
        s.text = self.vocab.text(shown, not self.params.skip_special_tokens)
        s.held = 0
        s.finish, s.stop_reason, s.stop_type = "stop", (None if tid == self.vocab.eos else tid), "token"

    def stage_ended(self) -> Completion | None:
        """The running stage's request has ended (its stream read to the end, or cancelled here)."""
        st = self.stage
        if st is not None and st.kind == "score":
            self._take_scores(st)
        elif st is not None and st.kind == "main":
            for s in self.seqs:
                if s.finish is None:  # its stream ended without its last chunk
                    s.finish, s.stop_type = "abort", "none"
        self.stage = None
        if self.done and not self._final_given:
            self._final_given = True
            return self._completion(self._outputs(), finished=True)
        return None

    def _take_scores(self, st: Stage) -> None:
        start, end = st.span
        want = self.prompt_ids[start:end]
        got = [int(p.get("id", -1)) for p in self._scored]
        if got != want:
            raise RequestError(500, "server_error", f"prompt_logprobs: the server scored tokens {got} where the "
                               f"prompt has {want} (positions {start} to {end - 1})")
        k = int(self.params.prompt_logprobs or 0)
        entries, _ = logprobs_of([{**p, "top_logprobs": (p.get("top_logprobs") or [])[:k]} for p in self._scored])
        if self.prompt_logprobs is None:
            self.prompt_logprobs = [None]
        self.prompt_logprobs += entries or []
        self._scored = []
        if not self._stages:
            self._phase = "answer"

    def _note_times(self, chunk: dict[str, Any], i: int, has_tokens: bool) -> None:
        timings = chunk.get("timings") or {}
        if self.num_cached_tokens is None and "cache_n" in timings:
            self.num_cached_tokens = int(timings["cache_n"])
        if not has_tokens:
            return
        now = time.monotonic()
        t = self._times
        if not t["first"]:
            t["first"] = now
            t["scheduled"] = now - float(timings.get("prompt_ms", 0.0)) / 1000.0
        t["last"] = now

    def metrics(self) -> RequestStateStats | None:
        if not self._measure:
            return None
        t = self._times
        return RequestStateStats(num_generation_tokens=sum(len(s.ids) for s in self.seqs), arrival_time=t["arrival"],
                                 queued_ts=t["queued"], scheduled_ts=t["scheduled"], first_token_ts=t["first"],
                                 last_token_ts=t["last"],
                                 first_token_latency=(t["first"] - t["queued"]) if t["first"] else 0.0)

    # --- outputs ---

    def _outputs(self, unfinished: str | None = None) -> list[CompletionOutput]:
        return [sequence_output(j, s.visible if self.params.detokenize else "", list(s.ids), list(s.probs),
                                s.finish or unfinished, s.stop_reason) for j, s in enumerate(self.seqs)]

    def _output(self, i: int) -> Completion | None:
        kind = self.params.output_kind
        done = self.done
        if kind == RequestOutputKind.FINAL_ONLY:
            if not done:
                return None
            outs = self._outputs()
        elif kind == RequestOutputKind.DELTA:
            s = self.seqs[i]
            vis = s.visible
            outs = [sequence_output(i, vis[s.shown_text:] if self.params.detokenize else "", s.ids[s.shown_ids:],
                                    s.probs[s.shown_ids:], s.finish, s.stop_reason)]
            s.shown_text, s.shown_ids = len(vis), len(s.ids)
        else:
            outs = self._outputs()
        if done:
            self._final_given = True
        return self._completion(outs, finished=done)

    def _completion(self, outs: list[CompletionOutput], finished: bool) -> Completion:
        chunk = self._last_chunk
        first = self.seqs[0]
        stop = first.stop_type or str(chunk.get("stop_type") or "")
        return Completion(first.visible if self.params.detokenize else "", len(self.prompt_ids),
                          sum(len(s.ids) for s in self.seqs), stop, chunk.get("timings") or {}, chunk, outs,
                          request_id=self.request_id, finished=finished, num_cached_tokens=self.num_cached_tokens,
                          prompt_logprobs=self.prompt_logprobs, metrics=self.metrics(), **self.prompt_fields)

    def aborted(self) -> Completion:
        """The last output of a request aborted before it ended: what each sequence had, the
        unfinished ones with finish_reason "abort"."""
        self._final_given = True
        return replace(self._completion(self._outputs(unfinished="abort"), finished=True), stop="abort")


def generate_sync(engine: Any, prompts: Sequence[Any], params: Sequence[SamplingParams], *,
                  progress: Callable[[int, int, Any], None] | None = None, timeout: float | None = None,
                  return_exceptions: bool = False, **fields: Any) -> list[Any]:
    """vLLM's generate over the Engine: every prompt's run at once, its stages one after another,
    the outputs in input order (Engine.generate's contract: GenerateError unless return_exceptions,
    TimeoutError after cancelling what still runs)."""
    from .engine import GenerateError, RequestCancelled

    engine.request_rules().check_keywords("generate()", fields)
    engine.request_rules().check("generate()", fields)
    # as vLLM's LLM.generate: one output per prompt, once it has ended
    runs = [VllmRun(engine, p, replace(sp, output_kind=RequestOutputKind.FINAL_ONLY), fields,
                    where=f"generate(): prompts[{i}]") for i, (p, sp) in enumerate(zip(prompts, params))]
    results: list[Any] = [None] * len(runs)
    active: dict[int, Any] = {}

    def start(i: int) -> None:
        st = runs[i].next_stage()
        if st is None:
            return
        req = engine.submit(st.prompt, **st.fields)
        runs[i].request_id = runs[i].request_id or req.request_id
        active[i] = req

    try:
        for i in range(len(runs)):
            start(i)
    except Exception:  # a later prompt refused at the call: the ones already started do not run on
        for req in active.values():
            req.cancel(wait=0)
        raise
    deadline = None if timeout is None else time.monotonic() + timeout
    total = len(runs)
    while active:
        handles = [r._handle for r in active.values()]
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not engine._drive(lambda: any(h.done or h.has_chunks() for h in handles), handles[0].wait_chunk, left):
            for req in active.values():
                req.cancel(wait=0)
            n_left = len(active)
            for req in active.values():
                req.cancel()
            raise TimeoutError(f"generate(): not done within {timeout} s; cancelled the {n_left} of its {total} "
                               "requests still running")
        n_done = total - len(active)
        for i, req in list(active.items()):
            run = runs[i]
            try:
                for chunk in req.poll():
                    _keep_last(results, i, run.feed(chunk))
                if run.cancel_wanted and not req._is_done():
                    req.cancel(wait=0)
                if not req._is_done():
                    continue
                for chunk in req.poll():
                    _keep_last(results, i, run.feed(chunk))
                del active[i]
                _keep_last(results, i, run.stage_ended())
                start(i)
            except (RequestError, RequestCancelled) as e:
                results[i] = e
                active.pop(i, None)
                if not req._is_done():
                    req.cancel(wait=0)
        if progress is not None and total - len(active) != n_done:
            progress(total - len(active), total, None)
    if not return_exceptions and any(isinstance(x, Exception) for x in results):
        raise GenerateError(results)
    return results


def _keep_last(results: list[Any], i: int, out: Completion | None) -> None:
    if out is not None and out.finished:
        results[i] = out
