"""llama-cpp-python's programs run as they do on llama-cpp-python (issue 64, "the third set"): a prompt
longer than the context is a ValueError; every chat_format llama-cpp-python names renders the prompt
its formatter renders, with its stop strings (or is refused naming those that render); logprobs
have no entry for the end-of-generation token, which the usage does not count, and top_logprobs
without logprobs is taken and unused. The expected prompts are written out from llama-cpp-python
0.3.36's `llama_cpp/llama_chat_format.py`; where llama-cpp-python is installed, the same calls run
on it in a child process and are compared (it skips, naming the package, where it is not)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from llama_preempt import ContextSizeError, Engine, Llama, RequestError
from llama_preempt.chat_formats import CHAT_FORMATS, HANDLER_FORMATS

PIRATE = [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."}]
TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Ahoy!"}, {"role": "user", "content": "Where is Rome?"}]
ROME = [{"role": "user", "content": "Where is Rome?"}]
ITALY = 'root ::= "Italy."'  # the answer a grammar makes the model give, then its end-of-generation token
LONG_PROMPT = "Once upon a time " * 100  # about 400 tokens of stories260K

VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
          "detailed, and polite answers to the user's questions.")
OPENBUDDY = ("You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human "
             "User.\nAlways answer as helpfully and logically as possible, while being safe. Your answers should not "
             "include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal "
             "content. Please ensure that your responses are socially unbiased and positive in nature.\nIf a question "
             "does not make any sense, or is not factually coherent, explain why instead of answering something not "
             "correct. If you don't know the answer to a question, please don't share false information.\nYou can "
             "speak fluently in many languages, for example: English, Chinese.\nYou cannot access the internet, but "
             "you have vast knowledge, cutoff: 2021-09.\nYou are trained by OpenBuddy team, (https://openbuddy.ai, "
             "https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not "
             "related to GPT or OpenAI.\n\n\n")
OPEN_ORCA = ("You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be "
             "sure you get the right answer. If you make a mistake or encounter an error in your thinking, say so out "
             "loud and attempt to correct it. If you don't know or aren't sure about something, say so clearly. You "
             "will act as a professional logician, mathematician, and physicist. You will also act as the most "
             "appropriate type of expert to answer any particular question or solve the relevant problem; state "
             "which expert type your are, if so. Also think of any particular named expert that would be ideal to "
             "answer the relevant question or solve the relevant problem; name and act as them, if "
             "appropriate.<|end_of_turn|>\n")

# chat_format -> (the prompt of PIRATE, the prompt of TURNS, the stop strings), as llama-cpp-python 0.3.36's
# formatters make them
RENDERED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    'alpaca': (
        'You are a pirate.\n\n### Instruction: Say hello.\n\n',
        'Be brief.\n\n### Instruction: Hi\n\n### Response: Ahoy!</s>### Instruction: Where is Rome?\n\n',
        ()),
    'baichuan': (
        'You are a pirate.<reserved_102>Say hello.<reserved_103>',
        'Be brief.<reserved_102>Hi<reserved_103>Ahoy!<reserved_102>Where is Rome?<reserved_103>',
        ()),
    'baichuan-2': (
        'You are a pirate.<reserved_106>Say hello.<reserved_107>',
        'Be brief.<reserved_106>Hi<reserved_107>Ahoy!<reserved_106>Where is Rome?<reserved_107>',
        ()),
    'chatglm3': (
        '<|system|>\nYou are a pirate.<|user|>\n Say hello.<|assistant|>',
        '<|system|>\nBe brief.<|user|>\n Hi<|assistant|>\n Ahoy!<|user|>\n Where is Rome?<|assistant|>',
        ('</s>',)),
    'chatml': (
        ('<|im_start|>system\n'
         'You are a pirate.<|im_end|>\n'
         '<|im_start|>user\n'
         'Say hello.<|im_end|>\n'
         '<|im_start|>assistant\n'),
        ('<|im_start|>system\n'
         'Be brief.<|im_end|>\n'
         '<|im_start|>user\n'
         'Hi<|im_end|>\n'
         '<|im_start|>assistant\n'
         'Ahoy!<|im_end|>\n'
         '<|im_start|>user\n'
         'Where is Rome?<|im_end|>\n'
         '<|im_start|>assistant\n'),
        ('<|im_end|>',)),
    'gemma': (
        '<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n',
        ('<start_of_turn>user\n'
         'Hi<end_of_turn>\n'
         '<start_of_turn>model\n'
         'Ahoy!<end_of_turn>\n'
         '<start_of_turn>user\n'
         'Where is Rome?<end_of_turn>\n'
         '<start_of_turn>model\n'),
        ('<end_of_turn>\n',)),
    'intel': (
        '### System:\n{system_message}\n### User:: Say hello.\n### Assistant::',
        ('### System:\n'
         '{system_message}\n'
         '### User:: Hi\n'
         '### Assistant:: Ahoy!\n'
         '### User:: Where is Rome?\n'
         '### Assistant::'),
        ()),
    'llama-2': (
        '[INST] <<SYS>>\nYou are a pirate.\n<</SYS>> Say hello. [/INST]',
        '[INST] <<SYS>>\nBe brief.\n<</SYS>> Hi [/INST]Ahoy! </s><s>[INST]Where is Rome?  [/INST]',
        ()),
    'llama-3': (
        ('<|start_header_id|>system<|end_header_id|>\n'
         '\n'
         'You are a pirate.<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
         '\n'
         'Say hello.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
         '\n'),
        ('<|start_header_id|>system<|end_header_id|>\n'
         '\n'
         'Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
         '\n'
         'Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
         '\n'
         'Ahoy!<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
         '\n'
         'Where is Rome?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
         '\n'),
        ('<|eot_id|>',)),
    'mistral-instruct': (
        '[INST] Say hello. [/INST]',
        '[INST] Hi [/INST]Ahoy!</s>[INST] Where is Rome? [/INST]',
        ('</s>',)),
    'mistrallite': (
        '<|system|>You are a pirate.</s><|prompter|>Say hello. </s>\n<|assistant|>',
        ('<|system|>Be brief.</s><|prompter|>Hi </s>\n'
         '<|assistant|>Ahoy! <|prompter|>Where is Rome? </s>\n'
         '<|assistant|>'),
        ()),
    'oasst_llama': (
        '[INST] <<SYS>>\nYou are a pirate.\n<</SYS>>\n\n<|prompter|>Say hello.</s><|assistant|>',
        ('[INST] <<SYS>>\n'
         'Be brief.\n'
         '<</SYS>>\n'
         '\n'
         '<|prompter|>Hi</s><|assistant|>Ahoy!</s><|prompter|>Where is Rome?</s><|assistant|>'),
        ()),
    # llama-cpp-python maps the roles "User" and "Assistant", so OpenAI's lower-case ones are dropped
    'open-orca': (OPEN_ORCA + 'Assistant: ', OPEN_ORCA + 'Assistant: ', ('User',)),
    'openbuddy': (OPENBUDDY + 'User: Say hello.\nAssistant:',
                  OPENBUDDY + 'User: Hi\nAssistant: Ahoy!\nUser: Where is Rome?\nAssistant:', ()),
    'openchat': (
        ('You are a pirate.<|end_of_turn|><|end_of_turn|>\n'
         'GPT4 Correct User: \n'
         'Say hello.<|end_of_turn|>\n'
         '<|end_of_turn|>GPT4 Correct Assistant: \n'),
        ('Be brief.<|end_of_turn|><|end_of_turn|>\n'
         'GPT4 Correct User: \n'
         'Hi<|end_of_turn|>\n'
         '<|end_of_turn|>GPT4 Correct Assistant: \n'
         'Ahoy!<|end_of_turn|>\n'
         'GPT4 Correct User: \n'
         'Where is Rome?<|end_of_turn|>\n'
         '<|end_of_turn|>GPT4 Correct Assistant: \n'),
        ('<|end_of_turn|>',)),
    'phind': (
        ('### System Prompt\n'
         'You are an intelligent programming assistant.\n'
         '\n'
         '### User Message: Say hello.\n'
         '\n'
         '### Assistant:'),
        ('### System Prompt\n'
         'You are an intelligent programming assistant.\n'
         '\n'
         '### User Message: Hi\n'
         '\n'
         '### Assistant: Ahoy!\n'
         '\n'
         '### User Message: Where is Rome?\n'
         '\n'
         '### Assistant:'),
        ()),
    'pygmalion': (
        '<|system|>You are a pirate.\n\n<|user|>\nSay hello.\n\n<|model|>\n',
        '<|system|>Be brief.\n\n<|user|>\nHi\n\n<|model|>\nAhoy!\n\n<|user|>\nWhere is Rome?\n\n<|model|>\n',
        ('\n',)),
    'qwen': (
        ('<|im_start|>system\n'
         'You are a pirate.<|im_end|>\n'
         '<|im_start|>user\n'
         'Say hello.<|im_end|>\n'
         '<|im_start|>assistant\n'),
        ('<|im_start|>system\n'
         'Be brief.<|im_end|>\n'
         '<|im_start|>user\n'
         'Hi<|im_end|>\n'
         '<|im_start|>assistant\n'
         'Ahoy!<|im_end|>\n'
         '<|im_start|>user\n'
         'Where is Rome?<|im_end|>\n'
         '<|im_start|>assistant\n'),
        ('<|endoftext|>',)),
    'redpajama-incite': (
        'You are a pirate.\n<human>: Say hello.\n<bot>:',
        'Be brief.\n<human>: Hi\n<bot>: Ahoy!\n<human>: Where is Rome?\n<bot>:',
        ('<human>',)),
    'saiga': (
        '<s>system\nYou are a pirate.</s><s>user\nSay hello.</s><s>bot',
        '<s>system\nBe brief.</s><s>user\nHi</s><s>user\nWhere is Rome?</s><s>bot',
        ()),
    'snoozy': (
        'You are a pirate.\n### Prompt: Say hello.\n### Response:',
        'Be brief.\n### Prompt: Hi\n### Response: Ahoy!\n### Prompt: Where is Rome?\n### Response:',
        ('###',)),
    'vicuna': (VICUNA + ' USER: Say hello. ASSISTANT:',
               VICUNA + ' USER: Hi ASSISTANT: Ahoy!</s>USER: Where is Rome? ASSISTANT:', ()),
    'zephyr': (
        '<|system|>\nYou are a pirate.</s>\n<|user|>\n\nSay hello.</s>\n<|assistant|>\n\n',
        ('<|system|>\n'
         'Be brief.</s>\n'
         '<|user|>\n'
         '\n'
         'Hi</s>\n'
         '<|assistant|>\n'
         '\n'
         'Ahoy!</s>\n'
         '<|user|>\n'
         '\n'
         'Where is Rome?</s>\n'
         '<|assistant|>\n'
         '\n'),
        ('</s>',)),
}


def llama_cpp_or_skip() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36 runs this comparison)")


def run_llama_cpp(code: str) -> Any:
    """`code` run on llama-cpp-python in a child process (its own libllama, apart from ours): the JSON
    it prints last."""
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[Llama]:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=1, verbose=False, logits_all=True) as m:
        yield m


# --- the context error ---

def test_a_prompt_longer_than_the_context_is_llama_cpps_value_error_and_the_servers_request_error(llm: Llama) -> None:
    try:  # the program llama-cpp-python's users write
        llm(LONG_PROMPT, max_tokens=4)
        caught: ValueError | None = None
    except ValueError as e:
        caught = e
    assert isinstance(caught, ContextSizeError) and isinstance(caught, RequestError)
    n_prompt = len(llm.tokenize(LONG_PROMPT.encode()))
    assert str(caught).startswith(f"Requested tokens ({n_prompt}) exceed context window of 256: shorten the prompt")
    assert (caught.status, caught.type, caught.n_prompt_tokens, caught.n_ctx) == \
        (400, "exceed_context_size_error", n_prompt, 256)
    with pytest.raises(ValueError, match=r"Requested tokens \(\d+\) exceed context window of 256"):  # read, streamed
        list(llm.create_chat_completion([{"role": "user", "content": LONG_PROMPT}], max_tokens=4, stream=True))
    # the Engine's own llama-cpp-python calls raise it too; its submit() keeps the server's RequestError
    with pytest.raises(ContextSizeError):
        llm.engine.create_completion(LONG_PROMPT, max_tokens=4)
    with pytest.raises(RequestError) as plain:
        llm.engine.submit(LONG_PROMPT, n_predict=4).result()
    assert plain.value.type == "exceed_context_size_error"
    assert llm("Once upon a time", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2


def test_the_context_error_says_what_llama_cpp_python_says(stories_model: Path, llm: Llama) -> None:
    llama_cpp_or_skip()
    theirs = run_llama_cpp(f"""
        import json, llama_cpp
        llm = llama_cpp.Llama(model_path={str(stories_model)!r}, n_ctx=256, verbose=False)
        try:
            llm.create_completion({LONG_PROMPT!r}, max_tokens=4)
            print(json.dumps(None))
        except ValueError as e:
            print(json.dumps(str(e)))
    """)
    with pytest.raises(ValueError) as ours:
        llm.create_completion(LONG_PROMPT, max_tokens=4)
    assert theirs is not None and str(ours.value).startswith(theirs + ":")


# --- chat_format ---

def test_the_chat_formats_are_llama_cpp_pythons_prompt_formats() -> None:
    assert set(CHAT_FORMATS) == set(RENDERED)
    assert not set(CHAT_FORMATS) & set(HANDLER_FORMATS)
    for name, (_, _, stop) in RENDERED.items():
        assert CHAT_FORMATS[name].stop == stop, name


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_each_chat_format_renders_the_prompt_llama_cpp_python_renders(stories_model: Path, name: str) -> None:
    pirate, turns, _ = RENDERED[name]
    with Llama(model_path=str(stories_model), n_ctx=1024, n_parallel=1, chat_format=name, verbose=False) as llm:
        assert llm.render_chat(PIRATE) == pirate
        assert llm.render_chat(TURNS) == turns
        # generated from the tokens llama-cpp-python generates from: the model's BOS where it adds one,
        # and special-token text ("<s>", "<|im_start|>") read as those tokens
        out = llm.create_chat_completion(TURNS, max_tokens=1, temperature=0)
        assert out["usage"]["prompt_tokens"] == len(llm.tokenize(turns.encode(), add_bos=True, special=True))


def test_the_chat_formats_render_as_llama_cpp_pythons_own_formatters(stories_model: Path) -> None:
    llama_cpp_or_skip()
    theirs = run_llama_cpp(f"""
        import json
        from llama_cpp import llama_chat_format as f

        class Captured(Exception):
            pass

        class Stub:  # what a chat handler asks of its Llama: the prompt's tokens, then the completion
            verbose = False

            def tokenize(self, text, add_bos=True, special=False):
                self.prompt, self.add_bos, self.special = text.decode("utf-8"), add_bos, special
                return []

            def create_completion(self, **kw):
                self.stop = kw.get("stop")
                raise Captured()

        out = {{"names": sorted(f.LlamaChatCompletionHandlerRegistry()._chat_handlers)}}
        for name in {sorted(RENDERED)!r}:
            for messages in ({PIRATE!r}, {TURNS!r}):
                stub = Stub()
                try:
                    f.get_chat_completion_handler(name)(llama=stub, messages=messages)
                except Captured:
                    pass
                out.setdefault(name, []).append([stub.prompt, stub.stop, stub.add_bos, stub.special])
        print(json.dumps(out))
    """)
    assert sorted(theirs.pop("names")) == sorted([*RENDERED, *HANDLER_FORMATS])
    for name, rendered in sorted(theirs.items()):
        with Engine(stories_model, n_ctx=1024, n_parallel=1, chat_format=name) as eng:
            for messages, (prompt, stop, add_bos, special) in zip((PIRATE, TURNS), rendered):
                assert eng.render_chat(messages) == prompt, name
                assert list(CHAT_FORMATS[name].stop) == stop and add_bos and special, name


@pytest.mark.parametrize("name", [*HANDLER_FORMATS, "alpaca-9000"])
def test_a_chat_format_with_no_prompt_format_is_refused_naming_those_that_render(stories_model: Path,
                                                                                name: str) -> None:
    with pytest.raises(ValueError, match=f"chat_format='{name}'") as e:
        Llama(model_path=str(stories_model), n_ctx=256, chat_format=name, verbose=False)
    assert all(f in str(e.value) for f in RENDERED)


def test_a_chat_formats_stop_strings_end_the_answer_after_the_calls_own(stories_model: Path) -> None:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=1, chat_format="snoozy", verbose=False) as llm:
        out = llm.create_chat_completion(ROME, grammar='root ::= "Ahoy###more"', max_tokens=16, temperature=0)
        assert (out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"]) == ("Ahoy", "stop")
        out = llm.create_chat_completion(ROME, grammar='root ::= "Ah-oy###more"', stop=["-"], max_tokens=16,
                                         temperature=0)
        assert out["choices"][0]["message"]["content"] == "Ah"


# --- logprobs ---

def test_chat_logprobs_have_no_entry_for_the_end_of_turn_and_the_usage_does_not_count_it(llm: Llama) -> None:
    out = llm.create_chat_completion(ROME, grammar=ITALY, logprobs=True, top_logprobs=2, max_tokens=32,
                                     temperature=0)
    choice = out["choices"][0]
    entries = choice["logprobs"]["content"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Italy.", "stop")
    assert "".join(e["token"] for e in entries) == "Italy." and all(e["token"] for e in entries)
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    assert out["usage"]["completion_tokens"] == len(entries)
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + len(entries)
    # the same count without logprobs, and streamed
    plain = llm.create_chat_completion(ROME, grammar=ITALY, max_tokens=32, temperature=0)
    assert plain["usage"]["completion_tokens"] == len(entries)
    chunks = list(llm.create_chat_completion(ROME, grammar=ITALY, logprobs=True, top_logprobs=2, max_tokens=32,
                                             temperature=0, stream=True, stream_options={"include_usage": True}))
    streamed = [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [len(entries)]


def test_an_answer_cut_by_a_stop_string_keeps_the_count_the_server_gives(llm: Llama) -> None:
    out = llm.create_chat_completion(ROME, grammar=ITALY, stop=["y"], logprobs=True, max_tokens=32, temperature=0)
    assert out["choices"][0]["message"]["content"] == "Ital"
    # the tokens up to the one that holds the stop string, as llama_cpp counts them; the entries end before it
    assert out["usage"]["completion_tokens"] == len(out["choices"][0]["logprobs"]["content"]) + 1


def test_top_logprobs_without_logprobs_is_taken_and_gives_no_logprobs_as_in_llama_cpp_python(llm: Llama) -> None:
    for asked in ({"top_logprobs": 2}, {"top_logprobs": 2, "logprobs": False}):
        out = llm.create_chat_completion(ROME, grammar=ITALY, max_tokens=32, temperature=0, **asked)
        assert out["choices"][0]["message"]["content"] == "Italy." and out["choices"][0].get("logprobs") is None
    with pytest.raises(TypeError, match="top_logprobs must be an int"):  # still a caller's mistake
        llm.create_chat_completion(ROME, top_logprobs=1.5)


def test_completion_logprobs_and_their_stream_leave_out_the_end_of_generation_token(llm: Llama) -> None:
    out = llm.create_completion("Rome is in", grammar=ITALY, logprobs=2, max_tokens=32, temperature=0)
    lp = out["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == out["choices"][0]["text"] == "Italy."
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert out["usage"]["completion_tokens"] == len(lp["tokens"])
    chunks = list(llm.create_completion("Rome is in", grammar=ITALY, logprobs=2, max_tokens=32, temperature=0,
                                        stream=True))
    assert [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])] == lp["tokens"]
    assert all(c["choices"][0]["text"] for c in chunks if not c["choices"][0]["finish_reason"])  # no empty chunk
    assert chunks[-1]["usage"]["completion_tokens"] == len(lp["tokens"])


def test_logprobs_come_as_llama_cpp_python_gives_them(stories_model: Path) -> None:
    llama_cpp_or_skip()
    theirs = run_llama_cpp(f"""
        import json, llama_cpp
        llm = llama_cpp.Llama(model_path={str(stories_model)!r}, n_ctx=256, logits_all=True, chat_format="chatml",
                              verbose=False)
        g = llama_cpp.LlamaGrammar.from_string({ITALY!r}, verbose=False)
        a = llm.create_chat_completion({ROME!r}, grammar=g, logprobs=True, top_logprobs=2, max_tokens=32,
                                       temperature=0)
        b = llm.create_chat_completion({ROME!r}, grammar=g, top_logprobs=2, max_tokens=32, temperature=0)
        print(json.dumps({{"content": a["choices"][0]["message"]["content"],
                          "tokens": [e["token"] for e in a["choices"][0]["logprobs"]["content"]],
                          "completion_tokens": a["usage"]["completion_tokens"],
                          "alone": b["choices"][0]["logprobs"]}}))
    """)
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=1, logits_all=True, chat_format="chatml",
               verbose=False) as llm:
        a = llm.create_chat_completion(ROME, grammar=ITALY, logprobs=True, top_logprobs=2, max_tokens=32,
                                       temperature=0)
        b = llm.create_chat_completion(ROME, grammar=ITALY, top_logprobs=2, max_tokens=32, temperature=0)
    ours = [e["token"] for e in a["choices"][0]["logprobs"]["content"]]
    assert theirs["content"] == a["choices"][0]["message"]["content"] == "Italy."
    # one entry per token the answer holds, none for the end of turn, and the usage counting those
    assert "".join(theirs["tokens"]) == "".join(ours) == "Italy."
    assert theirs["completion_tokens"] == len(theirs["tokens"]) and a["usage"]["completion_tokens"] == len(ours)
    assert theirs["alone"] is None and b["choices"][0].get("logprobs") is None
