"""Issue 51's drop-in gaps, found by writing programs from llama-cpp-python's documented API with
only the import changed: `LlamaGrammar` (from_string, from_file, from_json_schema, and llama_cpp's
own grammar objects), `set_seed`, and `Llama.from_pretrained` from the local Hugging Face cache."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import llama_preempt
from llama_preempt import Llama, LlamaGrammar, RequestError

YES_NO = 'root ::= "yes" | "no"'
HI = [{"role": "user", "content": "Is the sky blue?"}]
# answers compared across calls must not depend on the batch or the cache: --deterministic, on the
# CPU (whose kernels it makes batch-invariant; a GPU build's Engine would offload)
SAME_ANSWERS: dict[str, Any] = {"args": ["-dev", "none"], "deterministic": True}


@pytest.fixture(scope="module")
def llm(stories_model: Path) -> Iterator[Llama]:
    with Llama(model_path=str(stories_model), n_ctx=256, n_parallel=2, verbose=False, **SAME_ANSWERS) as eng:
        yield eng


def text_of(out: Any) -> str:
    return str(out["choices"][0]["text"])


# --- LlamaGrammar ---

def test_llama_grammar_is_importable_and_holds_its_gbnf_as_llama_cpp_does() -> None:
    assert "LlamaGrammar" in llama_preempt.__all__
    g = LlamaGrammar.from_string(YES_NO, verbose=False)
    assert g._grammar == YES_NO and g._root == "root" and g.json_schema is None


def test_a_grammar_constrains_every_completion_call(llm: Llama) -> None:
    g = LlamaGrammar.from_string(YES_NO)
    assert text_of(llm("Is the sky blue?", max_tokens=4, grammar=g)) in ("yes", "no")
    assert text_of(llm.create_completion("Is the sky blue?", max_tokens=4, grammar=g)) in ("yes", "no")
    streamed = "".join(text_of(c) for c in llm("Is the sky blue?", max_tokens=4, grammar=g, stream=True)
                       if c["choices"])
    assert streamed in ("yes", "no")
    chat = llm.create_chat_completion(messages=HI, max_tokens=4, grammar=g)
    assert chat["choices"][0]["message"]["content"] in ("yes", "no")


def test_from_file_reads_a_gbnf_file_and_says_what_is_wrong_with_a_bad_one(llm: Llama, tmp_path: Path) -> None:
    path = tmp_path / "yes_no.gbnf"
    path.write_text(YES_NO + "\n")
    g = LlamaGrammar.from_file(path)
    assert g._grammar == YES_NO + "\n"
    assert text_of(llm("Is it?", max_tokens=4, grammar=g)) in ("yes", "no")
    with pytest.raises(FileNotFoundError, match="nope.gbnf"):
        LlamaGrammar.from_file(tmp_path / "nope.gbnf")
    (tmp_path / "empty.gbnf").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        LlamaGrammar.from_file(tmp_path / "empty.gbnf")


def test_from_json_schema_is_converted_by_the_server_and_the_answer_follows_the_schema(llm: Llama) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    g = LlamaGrammar.from_json_schema(json.dumps(schema))
    assert g.json_schema == schema and LlamaGrammar.from_json_schema(schema) == g
    out = llm("A number:", max_tokens=64, temperature=0, grammar=g)
    assert out["choices"][0]["finish_reason"] == "stop", out
    answer = json.loads(text_of(out))
    assert set(answer) == {"n"} and isinstance(answer["n"], int)
    chat = llm.create_chat_completion(messages=HI, max_tokens=64, temperature=0, grammar=g)
    assert chat["choices"][0]["finish_reason"] == "stop", chat
    assert isinstance(json.loads(chat["choices"][0]["message"]["content"])["n"], int)
    with pytest.raises(ValueError, match="not JSON"):
        LlamaGrammar.from_json_schema("{type: object")
    with pytest.raises(TypeError, match="JSON object"):
        LlamaGrammar.from_json_schema("[1, 2]")


def test_a_grammar_the_server_cannot_use_is_a_value_error_at_the_call_naming_grammar(llm: Llama) -> None:
    for bad in ("root ::= yes", LlamaGrammar.from_string("this is not gbnf"),
                LlamaGrammar.from_json_schema({"type": "bogus"})):
        with pytest.raises(ValueError, match="grammar=") as e:
            llm("Is it?", max_tokens=2, grammar=bad)
        assert isinstance(e.value, RequestError) and e.value.status == 400  # what the server answers
        with pytest.raises(ValueError, match="grammar="):
            list(llm("Is it?", max_tokens=2, grammar=bad, stream=True))
        with pytest.raises(ValueError, match="grammar="):
            llm.create_chat_completion(messages=HI, max_tokens=2, grammar=bad)
    with pytest.raises(TypeError, match="grammar must be GBNF text or a LlamaGrammar"):
        llm("Is it?", max_tokens=2, grammar=42)
    with pytest.raises(ValueError, match="empty"):
        LlamaGrammar.from_string("  ")
    assert text_of(llm("Is it?", max_tokens=4, grammar=YES_NO)) in ("yes", "no")  # the Engine serves on


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (pip install llama-cpp-python)")
def test_llama_cpps_own_grammar_object_works_too(stories_model: Path) -> None:
    # llama_cpp loads its own libllama: in a child process, as tests/test_neighbours.py loads the two
    code = (
        "import sys, llama_cpp\n"
        "from llama_preempt import Llama\n"
        "g = llama_cpp.LlamaGrammar.from_string('root ::= \"yes\" | \"no\"')\n"
        "with Llama(model_path=sys.argv[1], n_ctx=256, n_parallel=2, verbose=False) as llm:\n"
        "    print('text:', llm('Is it?', max_tokens=4, grammar=g)['choices'][0]['text'])\n"
        "    schema = llama_cpp.LlamaGrammar.from_json_schema('{\"type\": \"integer\"}')\n"
        "    print('int:', llm('Is it?', max_tokens=8, temperature=0, grammar=schema)['choices'][0]['text'])\n")
    p = subprocess.run([sys.executable, "-c", code, str(stories_model)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = dict(line.split(": ", 1) for line in p.stdout.splitlines() if ": " in line)
    assert got["text"] in ("yes", "no") and got["int"].strip().lstrip("-").isdigit(), p.stdout


# --- set_seed ---

def test_set_seed_sets_the_seeds_of_later_calls_as_llama_cpp_draws_them(llm: Llama) -> None:
    def story(**kw: Any) -> str:
        return text_of(llm("Once", max_tokens=16, temperature=1.0, **kw))

    llm.set_seed(42)
    first = [story(), story()]
    llm.set_seed(42)
    assert [story(), story()] == first  # the same answers after the same seed
    assert first[0] != first[1]  # each call draws the next seed, as llama_cpp's
    drawn = random.Random(42).randint(0, 0xFFFFFFFE)
    assert story(seed=drawn) == first[0]  # the first call sampled with llama_cpp's first draw from 42
    assert story(seed=drawn) == story(seed=drawn)  # a call's own seed wins
    llm.set_seed(42)
    chat = [llm.create_chat_completion(messages=HI, max_tokens=12, temperature=1.0) for _ in range(2)]
    llm.set_seed(42)
    again = [llm.create_chat_completion(messages=HI, max_tokens=12, temperature=1.0) for _ in range(2)]
    assert [c["choices"][0]["message"]["content"] for c in chat] == \
        [c["choices"][0]["message"]["content"] for c in again]


def test_set_seed_refuses_what_is_not_a_seed(llm: Llama) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        llm.set_seed("42")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        llm.set_seed(2**40)


# --- from_pretrained, from the local Hugging Face cache ---

REPO = "ggml-org/stories260K"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub(hub: Path, model: Path, names: tuple[str, ...] = ("stories260K.gguf",)) -> Path:
    """A hub cache as huggingface_hub lays it out: the blob once, each file a link to it in the
    snapshot refs/main names."""
    repo = hub / ("models--" + REPO.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    shutil.copyfile(model, repo / "blobs" / "a1b2c3")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    for name in names:
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(repo / "blobs" / "a1b2c3", (snap / name).parent))
    return snap


@pytest.fixture()
def no_hub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Hugging Face variables, and a home of our own (~/.cache/huggingface/hub under it)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def generates(llm: Llama) -> bool:
    return bool(text_of(llm("Once", max_tokens=4, temperature=0)))


def test_from_pretrained_loads_a_file_in_the_hub_cache_named_by_a_glob(stories_model: Path, tmp_path: Path,
                                                                       no_hub_env: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    snap = fake_hub(tmp_path / "hub", stories_model)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with Llama.from_pretrained(repo_id=REPO, filename="*.gguf", n_ctx=256, n_parallel=2, verbose=False) as llm:
        assert isinstance(llm, Llama) and llm.n_ctx() == 256  # the constructor's keywords passed on
        assert str(snap / "stories260K.gguf") in llm.args and generates(llm)


def test_from_pretrained_finds_the_cache_under_hf_home_or_home_or_cache_dir(stories_model: Path, tmp_path: Path,
                                                                            no_hub_env: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    snap = fake_hub(no_hub_env / ".cache" / "huggingface" / "hub", stories_model)  # ~/.cache/huggingface/hub
    with Llama.from_pretrained(REPO, "stories260K.gguf", n_ctx=256, n_parallel=2, verbose=False) as llm:
        assert str(snap / "stories260K.gguf") in llm.args and generates(llm)
    elsewhere = fake_hub(tmp_path / "hf" / "hub", stories_model)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # $HF_HOME/hub
    with Llama.from_pretrained(REPO, "stories260K.gguf", n_ctx=256, n_parallel=2, verbose=False) as llm:
        assert str(elsewhere / "stories260K.gguf") in llm.args
    given = fake_hub(tmp_path / "mine", stories_model)
    with Llama.from_pretrained(REPO, "*260K*", cache_dir=tmp_path / "mine", n_ctx=256, n_parallel=2,
                               verbose=False) as llm:
        assert str(given / "stories260K.gguf") in llm.args
    local = tmp_path / "local"
    local.mkdir()
    shutil.copyfile(stories_model, local / "stories260K.gguf")
    with Llama.from_pretrained(REPO, "*.gguf", local_dir=local, n_ctx=256, n_parallel=2, verbose=False) as llm:
        assert str(local / "stories260K.gguf") in llm.args


def test_from_pretrained_refuses_what_is_not_cached_naming_where_it_looked_and_model_path(
        stories_model: Path, tmp_path: Path, no_hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    snap = fake_hub(hub, stories_model, names=("stories260K.gguf", "q8/stories260K-Q8_0.gguf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(FileNotFoundError, match="model_path=") as e:
        Llama.from_pretrained(REPO, "*Q4_K_M.gguf")
    assert str(snap) in str(e.value) and "stories260K.gguf" in str(e.value)  # where, and what it holds
    with pytest.raises(FileNotFoundError, match="model_path=") as e:
        Llama.from_pretrained("someone/elsewhere", "*.gguf")
    assert str(hub / "models--someone--elsewhere") in str(e.value)
    with pytest.raises(ValueError, match="matches 2 files"):
        Llama.from_pretrained(REPO, "*.gguf")
    with pytest.raises(FileNotFoundError, match="additional_files"):
        Llama.from_pretrained(REPO, "stories260K.gguf", additional_files=["*-00002-of-00002.gguf"])
    with pytest.raises(TypeError, match="did you mean 'n_ctx'"):  # the rest goes to the constructor
        Llama.from_pretrained(REPO, "stories260K.gguf", n_ctxx=256)
    with Llama.from_pretrained(REPO, "q8/*", n_ctx=256, n_parallel=2, verbose=False) as llm:  # a path in the repo
        assert str(snap / "q8" / "stories260K-Q8_0.gguf") in llm.args

