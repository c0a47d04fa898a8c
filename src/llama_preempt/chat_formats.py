"""llama-cpp-python's chat formats (`Llama(chat_format=...)`) as Jinja chat templates for llama.cpp's
server, each rendering the prompt llama-cpp-python 0.3.36's own formatter makes
(`llama_cpp/llama_chat_format.py`, the `@register_chat_format` functions), character for character,
and adding the same stop strings to each chat request.

llama-cpp-python's formatters are Python functions over a handful of styles (`_format_llama2`,
`_format_add_colon_single`, `_format_chatml`, ...); each `ChatFormat` below is built from the same
style, roles, separators and system text, so the quirks come along (qwen's default system prompt,
intel's system text with its `{system_message}` left unfilled, open-orca's roles that OpenAI's
lower-case roles never match, snoozy's unused "### Instruction:" template). What they share:

- only the roles a format maps are rendered (others are dropped), and a message's content counts
  only where it is a string and not empty (`if message:` in llama-cpp-python);
- the system text is the first system message's content, or "";
- the generation prompt (the assistant's role, or llama-2's `[/INST]`) comes where
  `add_generation_prompt` is true, which the chat route always sets (llama-cpp-python always adds it).

The prompt is tokenized as llama-cpp-python tokenizes it: the model's BOS where it adds one, and
special-token text ("<s>", "<|im_start|>") read as those tokens.

The formats llama-cpp-python answers with Python code of its own (function calling, images) have
no template: `HANDLER_FORMATS` names them, and asking for one is a ValueError naming those that render.
"""
from __future__ import annotations

from dataclasses import dataclass

# llama-cpp-python's chat formats that are Python chat handlers (function calling), not a prompt format
HANDLER_FORMATS = ("chatml-function-calling", "functionary", "functionary-v1", "functionary-v2")


def _lit(text: str) -> str:
    """`text` as a Jinja string literal (llama.cpp's lexer takes these escapes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


@dataclass(frozen=True)
class ChatFormat:
    """One llama-cpp-python chat format: its name, the Jinja template that renders its prompt, and
    the stop strings llama-cpp-python adds to the request's own."""

    name: str
    template: str
    stop: tuple[str, ...] = ()


# the first system message's content ("" if none, or if it is not a string), as _get_system_message
# reads it; reading it also tells llama.cpp the template takes a system role, so it does not fold
# the system message into the first user message
_SYSTEM = ("{%- set ns = namespace(system='', seen=false, i=0, role='', c='', mapped=false) -%}"
           "{%- for m in messages -%}{%- if m['role'] == 'system' and not ns.seen -%}{%- set ns.seen = true -%}"
           "{%- if m['content'] is string -%}{%- set ns.system = m['content'] -%}{%- endif -%}{%- endif -%}"
           "{%- endfor -%}")


def _roles(roles: dict[str, str]) -> str:
    """The loop's head: ns.mapped, ns.role (the role's prefix) and ns.c (the content, '' for none),
    as _map_roles maps them."""
    branches = ""
    for role, prefix in roles.items():
        keyword = "elif" if branches else "if"
        branches += (f"{{%- {keyword} m['role'] == {_lit(role)} -%}}{{%- set ns.role = {_lit(prefix)} -%}}"
                     "{%- set ns.mapped = true -%}")
    return (f"{branches}{{%- else -%}}{{%- set ns.mapped = false -%}}{{%- endif -%}}"
            "{%- if m['content'] is string -%}{%- set ns.c = m['content'] -%}{%- else -%}{%- set ns.c = '' -%}"
            "{%- endif -%}")


def _sep(sep: str, sep2: str | None) -> str:
    """seps[i % 2] (sep alone where the style has one)."""
    if sep2 is None:
        return f"{{{{ {_lit(sep)} }}}}"
    return f"{{%- if ns.i % 2 == 0 -%}}{{{{ {_lit(sep)} }}}}{{%- else -%}}{{{{ {_lit(sep2)} }}}}{{%- endif -%}}"


def _template(system: str, roles: dict[str, str], style: str, sep: str, sep2: str | None = None,
              generation: str | None = None, suffix: str = "") -> str:
    """A template of llama-cpp-python's styles (_format_llama2, _format_add_colon_single,
    _format_add_colon_two, _format_no_colon_single, _format_add_colon_space_single, _format_chatml,
    _format_chatglm3). `system` is a Jinja expression over ns.system (the system text the style
    gets); `generation` the role whose empty turn ends the prompt (None: no such turn); `suffix`
    what follows it (llama-2's "[/INST]")."""
    head = f"{_SYSTEM}{{%- set ns.system = {system} -%}}"
    if style == "chatml":
        head += f"{{%- if ns.system != '' -%}}{{{{ ns.system + {_lit(sep)} + '\\n' }}}}{{%- endif -%}}"
    elif style in ("no_colon_single", "chatglm3"):
        head += "{{ ns.system }}"
    else:
        head += f"{{{{ ns.system }}}}{_sep(sep, None)}"
    # each style's turn with content, and without
    full, empty = {
        "llama2": (f"{{{{ ns.role + ns.c + ' ' }}}}{_sep(sep, sep2)}", "{{ ns.role + ' ' }}"),
        "add_colon_single": (f"{{{{ ns.role + ': ' + ns.c }}}}{_sep(sep, None)}", "{{ ns.role + ':' }}"),
        "add_colon_two": (f"{{{{ ns.role + ': ' + ns.c }}}}{_sep(sep, sep2)}", "{{ ns.role + ':' }}"),
        "no_colon_single": (f"{{{{ ns.role + ns.c }}}}{_sep(sep, None)}", "{{ ns.role }}"),
        "add_colon_space_single": (f"{{{{ ns.role + ': ' + ns.c }}}}{_sep(sep, None)}", "{{ ns.role + ': ' }}"),
        "chatml": (f"{{{{ ns.role + '\\n' + ns.c }}}}{_sep(sep, None)}{{{{ '\\n' }}}}", "{{ ns.role + '\\n' }}"),
        "chatglm3": ("{{ ns.role + '\\n' + ' ' + ns.c }}", "{{ ns.role }}"),
    }[style]
    turn = f"{{%- if ns.c -%}}{full}{{%- else -%}}{empty}{{%- endif -%}}"
    if style == "llama2":  # the system text takes the place of the first turn's role
        turn = f"{{%- if ns.system and ns.i == 0 -%}}{{{{ ns.c }}}}{_sep(sep, sep2)}{{%- else -%}}{turn}{{%- endif -%}}"
    body = (f"{{%- for m in messages -%}}{_roles(roles)}{{%- if ns.mapped -%}}{turn}"
            "{%- set ns.i = ns.i + 1 -%}{%- endif -%}{%- endfor -%}")
    tail = ""
    if generation is not None:
        tail = f"{{%- set ns.role = {_lit(roles[generation])} -%}}{empty}"
    if tail or suffix:
        tail = f"{{%- if add_generation_prompt -%}}{tail}{{{{ {_lit(suffix)} }}}}{{%- endif -%}}"
    return head + body + tail


def _system_or(default: str) -> str:
    return f"ns.system if ns.system != '' else {_lit(default)}"


def _wrapped(before: str, after: str = "") -> str:
    return f"{_lit(before)} + ns.system + {_lit(after)}"


# mistral-instruct: a turn counts where its content is a string, empty or not (not None). The server
# gives a template "" for a null content, so an assistant turn with tool calls and no content is
# taken as llama-cpp-python's None (skipped), any other empty one as ""
_MISTRAL_INSTRUCT = (_SYSTEM + "{%- for m in messages -%}"
                     "{%- if m['role'] == 'user' and m['content'] is string -%}{{ '[INST] ' + m['content'] }}"
                     "{%- elif m['role'] == 'assistant' and m['content'] is string and (m['content'] or not "
                     "m['tool_calls']) -%}{{ ' [/INST]' + m['content'] + '</s>' }}{%- endif -%}{%- endfor -%}"
                     "{%- if add_generation_prompt -%}{{ ' [/INST]' }}{%- endif -%}")

# saiga: "<s>{role}\n{content}</s>" per turn of user, bot and system (an "assistant" is dropped), then
# "<s>bot". Its prompt starts with "<s>", which llama.cpp takes off a rendered prompt that starts with
# the model's BOS text when the model adds a BOS itself (as every saiga model, LLaMA or Mistral, does):
# the BOS text twice keeps the one llama-cpp-python's prompt has after the BOS it adds
_SAIGA = (_SYSTEM + "{%- if bos_token == '<s>' -%}{{ bos_token }}{%- endif -%}{%- for m in messages -%}"
          "{%- if m['role'] in ['user', 'bot', 'system'] -%}{%- if m['content'] is string and m['content'] -%}"
          "{{ '<s>' + m['role'] + '\\n' + m['content'] + '</s>' }}{%- else -%}{{ '<s>' + m['role'] + '\\n' }}"
          "{%- endif -%}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<s>bot' }}{%- endif -%}")

_VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
           "detailed, and polite answers to the user's questions.")
_OPENBUDDY = """You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.
Always answer as helpfully and logically as possible, while being safe. Your answers should not include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive in nature.
If a question does not make any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't know the answer to a question, please don't share false information.
You can speak fluently in many languages, for example: English, Chinese.
You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.
You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.

"""
_SNOOZY = ("The prompt below is a question to answer, a task to complete, or a conversation to respond to; decide "
           "which and write an appropriate response.")
_OPEN_ORCA = (
    "You are a helpful assistant. Please answer truthfully and write out your "
    "thinking step by step to be sure you get the right answer. If you make a mistake or encounter "
    "an error in your thinking, say so out loud and attempt to correct it. If you don't know or "
    "aren't sure about something, say so clearly. You will act as a professional logician, mathematician, "
    "and physicist. You will also act as the most appropriate type of expert to answer any particular "
    "question or solve the relevant problem; state which expert type your are, if so. Also think of "
    "any particular named expert that would be ideal to answer the relevant question or solve the "
    "relevant problem; name and act as them, if appropriate.")

_UA = ("user", "assistant")


def _ua(user: str, assistant: str) -> dict[str, str]:
    return dict(zip(_UA, (user, assistant)))


CHAT_FORMATS: dict[str, ChatFormat] = {f.name: f for f in (
    ChatFormat("llama-2", _template(f"({_wrapped('[INST] <<SYS>>' + chr(10), chr(10) + '<</SYS>>')}) if ns.system "
                                    "else ''", _ua("<s>[INST]", "[/INST]"), "llama2", " ", "</s>",
                                    suffix="[/INST]")),
    ChatFormat("llama-3", _template("''", {"system": "<|start_header_id|>system<|end_header_id|>\n\n",
                                           "user": "<|start_header_id|>user<|end_header_id|>\n\n",
                                           "assistant": "<|start_header_id|>assistant<|end_header_id|>\n\n"},
                                    "no_colon_single", "<|eot_id|>", generation="assistant"), ("<|eot_id|>",)),
    ChatFormat("alpaca", _template("ns.system", _ua("### Instruction", "### Response"), "add_colon_two", "\n\n",
                                   "</s>")),
    ChatFormat("qwen", _template(f"'<|im_start|>system\\n' + ({_system_or('You are a helpful assistant.')})",
                                 _ua("<|im_start|>user", "<|im_start|>assistant"), "chatml", "<|im_end|>",
                                 generation="assistant"), ("<|endoftext|>",)),
    ChatFormat("vicuna", _template(_lit(_VICUNA), _ua("USER", "ASSISTANT"), "add_colon_two", " ", "</s>",
                                   generation="assistant")),
    ChatFormat("oasst_llama", _template(_wrapped("[INST] <<SYS>>\n", "\n<</SYS>>\n\n"),
                                        _ua("<|prompter|>", "<|assistant|>"), "no_colon_single", "</s>",
                                        generation="assistant")),
    ChatFormat("baichuan-2", _template("ns.system", _ua("<reserved_106>", "<reserved_107>"), "no_colon_single", "",
                                       generation="assistant")),
    ChatFormat("baichuan", _template("ns.system", _ua("<reserved_102>", "<reserved_103>"), "no_colon_single", "",
                                     generation="assistant")),
    ChatFormat("openbuddy", _template(_lit(_OPENBUDDY), _ua("User", "Assistant"), "add_colon_single", "\n",
                                      generation="assistant")),
    ChatFormat("redpajama-incite", _template("ns.system", _ua("<human>", "<bot>"), "add_colon_single", "\n",
                                             generation="assistant"), ("<human>",)),
    ChatFormat("snoozy", _template(_system_or(_SNOOZY), _ua("### Prompt", "### Response"), "add_colon_single", "\n",
                                   generation="assistant"), ("###",)),
    ChatFormat("phind", _template(_lit("### System Prompt\nYou are an intelligent programming assistant."),
                                  _ua("### User Message", "### Assistant"), "add_colon_single", "\n\n",
                                  generation="assistant")),
    ChatFormat("intel", _template(_lit("### System:\n{system_message}"), _ua("### User:", "### Assistant:"),
                                  "add_colon_single", "\n", generation="assistant")),
    # llama-cpp-python maps the roles "User" and "Assistant" (capitalized), so OpenAI's are dropped
    ChatFormat("open-orca", _template(_lit(_OPEN_ORCA), {"User": "User", "Assistant": "Assistant"},
                                      "add_colon_space_single", "<|end_of_turn|>\n", generation="Assistant"),
               ("User",)),
    ChatFormat("mistrallite", _template(_wrapped("<|system|>", "</s>"), _ua("<|prompter|>", "</s>\n<|assistant|>"),
                                        "no_colon_single", " ", generation="assistant")),
    ChatFormat("zephyr", _template(_wrapped("<|system|>\n"), _ua("<|user|>\n", "<|assistant|>\n"), "chatml", "</s>",
                                   generation="assistant"), ("</s>",)),
    ChatFormat("pygmalion", _template(_wrapped("<|system|>"), _ua("<|user|>", "<|model|>"), "chatml", "\n",
                                      generation="assistant"), ("\n",)),
    ChatFormat("chatml", _template(_wrapped("<|im_start|>system\n"), _ua("<|im_start|>user", "<|im_start|>assistant"),
                                   "chatml", "<|im_end|>", generation="assistant"), ("<|im_end|>",)),
    ChatFormat("mistral-instruct", _MISTRAL_INSTRUCT, ("</s>",)),
    ChatFormat("chatglm3", _template(_wrapped("<|system|>\n"), _ua("<|user|>", "<|assistant|>"), "chatglm3", "</s>",
                                     generation="assistant"), ("</s>",)),
    ChatFormat("openchat", _template(_wrapped("", "<|end_of_turn|>"),
                                     _ua("GPT4 Correct User: ", "<|end_of_turn|>GPT4 Correct Assistant: "), "chatml",
                                     "<|end_of_turn|>", generation="assistant"), ("<|end_of_turn|>",)),
    ChatFormat("saiga", _SAIGA),
    # gemma: a system message is not rendered
    ChatFormat("gemma", _template("''", _ua("<start_of_turn>user\n", "<start_of_turn>model\n"), "no_colon_single",
                                  "<end_of_turn>\n", generation="assistant"), ("<end_of_turn>\n",)),
)}


def chat_format(name: str) -> ChatFormat:
    """The chat format llama-cpp-python calls `name`; a ValueError naming those that render where it
    has none (a function-calling handler, or a name llama-cpp-python does not know)."""
    if not isinstance(name, str):
        raise TypeError(f"chat_format must be a string, got {type(name).__name__}")
    found = CHAT_FORMATS.get(name)
    if found is not None:
        return found
    supported = ", ".join(sorted(CHAT_FORMATS))
    if name in HANDLER_FORMATS:
        raise ValueError(f"chat_format={name!r} is one of llama-cpp-python's Python chat handlers (function calling), "
                         f"which llama.cpp's server cannot run; for tool calls pass tools= and tool_choice= to "
                         f"create_chat_completion with the model's own template (chat_format=None), or use one of the "
                         f"formats that render here: {supported}")
    raise ValueError(f"chat_format={name!r} is not one of llama-cpp-python's chat formats; those that render here: "
                     f"{supported} (or leave it None for the model's own template, or pass "
                     f"args=['--chat-template-file', PATH])")
