"""tool_choice as OpenAI, llama-cpp-python and vLLM define it: "none", "auto", "required" and the
named function, each honoured over HTTP and in the llama-cpp-python facade, streamed and not; a
template with no tool format of its own (stories260K's built-in chatml, SmolLM2's) gets a forced
call as JSON by grammar; a bad tool_choice is a 400 naming the field, and the server goes on."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, ServerFactory
from helpers import sse_events
from llama_preempt import Llama, models
from llama_preempt.errors import RequestError
from llama_preempt.server import LlamaServer

# string arguments bounded, so that a model as small as stories260K ends its call within max_tokens
# (it spends many tokens on the whitespace JSON allows between fields: each gap takes up to 22)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat(srv: LlamaServer, **body: Any) -> Any:
    r = srv.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 256, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def streamed_chat(srv: LlamaServer, **body: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """The tool calls a stream's deltas build (OpenAI's rule: a delta with an index extends that
    call), its finish_reason and its text."""
    lines = list(srv.stream("/v1/chat/completions", {"messages": ASK, "max_tokens": 256, "temperature": 0,
                                                     "stream": True, **body}))
    calls: dict[int, dict[str, Any]] = {}
    finish, text = None, ""
    for ev in sse_events(lines):
        if ev == "[DONE]" or not isinstance(ev, dict) or not ev.get("choices"):
            continue
        choice = ev["choices"][0]
        finish = choice.get("finish_reason") or finish
        delta = choice.get("delta", {})
        text += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            fn = tc.get("function", {})
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)], finish, text


def assert_time_call(name: str, arguments: str) -> None:
    assert name == "get_time"
    args = json.loads(arguments)
    assert set(args) == {"zone"} and args["zone"] in ("UTC", "CET", "PST"), args


@pytest.fixture(scope="module")
def stories(stories_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from helpers import new_server

    srv = new_server(stories_model, tmp_path_factory.mktemp("tool-choice"), n_ctx=2048, n_parallel=2)
    srv.start()
    yield srv
    srv.stop()


def test_a_named_function_is_called_with_arguments_that_fit_its_schema(stories: LlamaServer) -> None:
    # the tool named is the second of two: the call must be it, whatever the model would pick
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = chat(stories, tools=[WEATHER, TIME], tool_choice=named)
    assert choice["finish_reason"] == "tool_calls", choice
    msg = choice["message"]
    assert msg.get("content") in (None, "") and len(msg["tool_calls"]) == 1
    call = msg["tool_calls"][0]
    assert call["type"] == "function" and call["id"]
    assert_time_call(call["function"]["name"], call["function"]["arguments"])


def test_a_named_function_streams_as_tool_call_deltas(stories: LlamaServer) -> None:
    calls, finish, text = streamed_chat(stories, tools=[WEATHER, TIME],
                                        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert finish == "tool_calls" and text == "" and len(calls) == 1
    assert_time_call(calls[0]["name"], calls[0]["arguments"])


def test_the_responses_apis_named_function_is_the_same_choice(stories: LlamaServer) -> None:
    # the Responses API names the function at the top level: {"type": "function", "name": ...}
    choice = chat(stories, tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_time"})
    assert choice["finish_reason"] == "tool_calls"
    assert_time_call(choice["message"]["tool_calls"][0]["function"]["name"],
                     choice["message"]["tool_calls"][0]["function"]["arguments"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_calls_one_of_the_tools(stories: LlamaServer, stream: bool) -> None:
    if stream:
        calls, finish, _ = streamed_chat(stories, tools=[WEATHER, TIME], tool_choice="required")
    else:
        choice = chat(stories, tools=[WEATHER, TIME], tool_choice="required")
        finish = choice["finish_reason"]
        calls = [tc["function"] for tc in choice["message"]["tool_calls"]]
    assert finish == "tool_calls" and len(calls) == 1
    schema = {"get_weather": WEATHER, "get_time": TIME}[calls[0]["name"]]["function"]["parameters"]
    args = json.loads(calls[0]["arguments"])
    assert set(args) == set(schema["required"])


def test_none_and_auto_answer_in_text_where_the_template_has_no_tool_format(stories: LlamaServer) -> None:
    for how in ("none", "auto", None):
        choice = chat(stories, tools=[WEATHER, TIME], tool_choice=how, max_tokens=8)
        assert choice["message"].get("tool_calls") is None, (how, choice)
        assert choice["finish_reason"] == "length" and choice["message"]["content"], (how, choice)


def test_the_tools_are_described_to_a_template_without_a_tool_format(stories: LlamaServer) -> None:
    # /apply-template renders what the model is shown: only the named tool, and how to answer
    named = {"type": "function", "function": {"name": "get_time"}}
    r = stories.post("/apply-template", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": named})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "get_time" in prompt and "get_weather" not in prompt and "\"arguments\"" in prompt
    plain = stories.post("/apply-template", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "auto"})
    assert "get_time" not in plain.json()["prompt"]  # auto: the template shows what it shows (here, no tools)


@pytest.mark.parametrize("tool_choice,needle", [
    ("sometimes", "\"sometimes\" is not a choice"),
    (42, "must be a string or an object"),
    ({"type": "function"}, "needs a \\\"name\\\""),
    ({"type": "retrieval"}, "\"type\" must be \\\"function\\\""),
    ({"type": "function", "function": "get_time"}, "must be an object"),
    ({"type": "function", "function": {"name": "get_date"}}, "not among 'tools' (get_weather, get_time)"),
], ids=["unknown-word", "number", "no-name", "not-a-function", "function-a-string", "unknown-function"])
def test_a_bad_tool_choice_is_a_400_naming_the_field(stories: LlamaServer, tool_choice: Any, needle: str) -> None:
    r = stories.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "'tool_choice'" in err["message"]
    assert needle.replace("\\", "") in err["message"], err["message"]
    # the server goes on
    assert chat(stories, max_tokens=4)["finish_reason"] == "length"


def test_a_choice_that_needs_tools_without_tools_is_a_400(stories: LlamaServer) -> None:
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        r = stories.post("/v1/chat/completions", {"messages": ASK, "tool_choice": tool_choice})
        assert r.status_code == 400 and "'tool_choice'" in r.json()["error"]["message"], r.text


def test_anthropics_named_tool_is_called(stories: LlamaServer) -> None:
    r = stories.post("/v1/messages", {"model": "m", "max_tokens": 256, "messages": ASK,
                                      "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                                 "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)],
                                      "tool_choice": {"type": "tool", "name": "get_time"}})
    assert r.status_code == 200, r.text
    body = r.json()
    uses = [b for b in body["content"] if b["type"] == "tool_use"]
    assert body["stop_reason"] == "tool_use" and len(uses) == 1
    assert uses[0]["name"] == "get_time" and uses[0]["input"]["zone"] in ("UTC", "CET", "PST")


def test_a_native_tool_format_sees_only_the_named_tool(start_server: ServerFactory, qwen35_mtp_model: Path) -> None:
    # Qwen3.5's own template (upstream's copy) has a tool format of its own (Qwen3-Coder's XML): a
    # named function narrows the tools it renders and the grammar it gets, the generic JSON format
    # stays out, and a bad choice is refused as anywhere
    template = ROOT / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen3.5-4B.jinja"
    if not template.is_file():
        pytest.skip(f"upstream's Qwen3.5 template is not at {template} (run vendor/fetch.py)")
    srv = start_server(qwen35_mtp_model, n_ctx=1024, n_parallel=1,
                       extra_args=["--spec-type", "draft-mtp", "--chat-template-file", str(template)])
    named = {"type": "function", "function": {"name": "get_time"}}
    r = srv.post("/apply-template", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": named})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "get_time" in prompt and "get_weather" not in prompt
    assert "<tool_call>" in prompt and "You can call the following tools" not in prompt
    both = srv.post("/apply-template", {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required"})
    assert "get_time" in both.json()["prompt"] and "get_weather" in both.json()["prompt"]
    bad = srv.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "tool_choice": named})
    assert bad.status_code == 400 and "get_time" in bad.json()["error"]["message"]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return models.local_smollm2(lambda msg: None).path
    except models.ModelNotInstalled as e:
        pytest.skip(f"SmolLM2 is not here ({e})")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_llama_cpp_pythons_forced_tool_program_gets_its_call(smollm2: Path, stream: bool) -> None:
    # the program, only the import changed: llama-cpp-python answers get_weather {"city": "Paris"}
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    llm = Llama(model_path=str(smollm2), n_ctx=2048, verbose=False)
    try:
        out = llm.create_chat_completion(messages=ASK, tools=[weather], temperature=0, max_tokens=48, stream=stream,
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
        if stream:
            name, arguments, finish = "", "", None
            for chunk in out:
                choice = chunk["choices"][0]
                finish = choice.get("finish_reason") or finish
                for tc in choice["delta"].get("tool_calls") or []:
                    name += tc.get("function", {}).get("name") or ""
                    arguments += tc.get("function", {}).get("arguments") or ""
        else:
            choice = out["choices"][0]
            finish = choice["finish_reason"]
            call = choice["message"]["tool_calls"][0]
            name, arguments = call["function"]["name"], call["function"]["arguments"]
        assert finish == "tool_calls" and name == "get_weather"
        assert json.loads(arguments)["city"].strip().lower().startswith("paris"), arguments
        with pytest.raises(RequestError, match="'tool_choice'.*not among 'tools'"):
            llm.create_chat_completion(messages=ASK, tools=[weather], max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    finally:
        llm.close()
