"""llama-cpp-python's `LlamaGrammar`, for `grammar=` on the completion calls:

    from llama_preempt import Llama, LlamaGrammar     # was: from llama_cpp import Llama, LlamaGrammar
    grammar = LlamaGrammar.from_string('root ::= "yes" | "no"')
    llm("Is the sky blue?", grammar=grammar)

The server parses the GBNF (a grammar it cannot parse is a ValueError at the call, naming
`grammar`). A JSON-schema grammar keeps the schema and the server converts it with llama.cpp's own
converter (the request's `json_schema` field), exactly as it converts `response_format` schemas.
A `llama_cpp.LlamaGrammar` passed instead works too: its GBNF text is its `_grammar`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


@dataclass(frozen=True)
class LlamaGrammar:
    """A grammar for `grammar=`: GBNF text (`_grammar`, llama_cpp's attribute), or a JSON schema
    (`json_schema`; `_grammar` is then empty, the server converts the schema itself). Make one with
    `from_string`, `from_file` or `from_json_schema`, as with llama_cpp."""

    _grammar: str = ""
    json_schema: dict[str, Any] | None = None
    _root: str = LLAMA_GRAMMAR_DEFAULT_ROOT

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        """A GBNF grammar (llama.cpp's grammars/README.md); the server parses it when it is used.
        `verbose` is llama_cpp's and changes nothing here."""
        if not isinstance(grammar, str):
            raise TypeError(f"LlamaGrammar.from_string(): grammar must be GBNF text (a str), got {type(grammar).__name__}")
        if not grammar.strip():
            raise ValueError("LlamaGrammar.from_string(): the grammar is empty; give GBNF text with a root rule, "
                             "e.g. 'root ::= \"yes\" | \"no\"'")
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> "LlamaGrammar":
        """The GBNF grammar in a file (a .gbnf file of llama.cpp's grammars/, say)."""
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise FileNotFoundError(f"LlamaGrammar.from_file(): cannot read the grammar file {os.fspath(file)!r}: "
                                    f"{e.strerror or e}; give the path of a GBNF file") from None
        if not text.strip():
            raise ValueError(f"LlamaGrammar.from_file(): {os.fspath(file)!r} is empty; it must hold a GBNF grammar "
                             "with a root rule")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = True) -> "LlamaGrammar":
        """A grammar for JSON that follows `json_schema` (JSON text, as llama_cpp takes it, or a
        dict): converted to GBNF by the server with llama.cpp's own converter when it is used."""
        schema: Any = json_schema
        if isinstance(json_schema, str):
            try:
                schema = json.loads(json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"LlamaGrammar.from_json_schema(): json_schema is not JSON ({e}); give the schema "
                                 "as JSON text (json.dumps(schema)) or as a dict") from None
        if not isinstance(schema, dict):
            raise TypeError(f"LlamaGrammar.from_json_schema(): json_schema must be a JSON object (an object schema "
                            f"such as {{\"type\": \"object\"}}), got {type(schema).__name__}")
        return cls(json_schema=schema)


def grammar_fields(where: str, grammar: Any) -> dict[str, Any]:
    """The request fields of a call's `grammar=`: GBNF text as given, a LlamaGrammar's (ours, or
    llama_cpp's: its `_grammar`), a JSON-schema grammar as the server's `json_schema`."""
    if grammar is None:
        return {}
    if isinstance(grammar, str):
        return {"grammar": grammar}
    if isinstance(grammar, LlamaGrammar) and grammar.json_schema is not None:
        return {"json_schema": grammar.json_schema}
    text = getattr(grammar, "_grammar", None)
    if isinstance(text, str):
        return {"grammar": text}
    raise TypeError(f"{where}: grammar must be GBNF text or a LlamaGrammar (LlamaGrammar.from_string, from_file, "
                    f"from_json_schema), got {type(grammar).__name__}")
