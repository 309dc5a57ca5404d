"""Reference fixtures for verl's Hermes tool calling (issue 43 item 1): what verl's parser
extracts from model output, and what transformers' apply_chat_template renders when it is
given `tools=`, for src/text to reproduce exactly.

Run with Debian's Python (no network, no transformers needed):

    apt-get install -y python3-jinja2 python3-regex python3-yaml
    /usr/bin/python3 test/text/make_hermes_fixtures.py

Writes test/text/fixtures/hermes/reference.json:
  {
    "versions": {jinja2, regex},
    "parse": [{name, text, content, calls: [{name, arguments}]}]:
        verl's HermesToolParser.extract_tool_calls on `text` (verl
        verl/experimental/agent_loop/tool_parser.py): regex `<tool_call>(.*?)</tool_call>`
        (DOTALL) over the decoded text, json.loads of each match, name/arguments looked up
        (pydantic FunctionCall(name: str, arguments=json.dumps(arguments,
        ensure_ascii=False))); content = the text with the matches removed,
    "tool_schema": the `search` tool's schema as verl passes it to the chat template:
        search_tool_config.yaml's tool_schema validated into verl's OpenAIFunctionToolSchema
        and dumped with model_dump(exclude_unset=True, exclude_none=True) (verl
        verl/tools/schemas.py, verl/experimental/agent_loop/tool_agent_loop.py),
    "chat": [{name, template, messages, tools, add_generation_prompt, text}]:
        apply_chat_template(messages, tools=tools, add_generation_prompt=...,
        tokenize=False) rendered by Jinja2 in the environment transformers builds
        (transformers src/transformers/utils/chat_template_utils.py,
        _compile_jinja_template: ImmutableSandboxedEnvironment(trim_blocks=True,
        lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]), its
        `tojson` filter = json.dumps(x, ensure_ascii=False, indent=None, separators=None,
        sort_keys=False), globals raise_exception and strftime_now; render(messages=...,
        tools=..., documents=None, add_generation_prompt=...)). The `{% generation %}`
        extension is left out: Qwen2.5's template does not use it.
  }

The template is test/text/fixtures/templates/qwen2.5-instruct.jinja (Qwen2.5-7B-Instruct's
tokenizer_config.json "chat_template", as test/text/make_fixtures.py documents); the tool
config is test/text/fixtures/hermes/search_tool_config.yaml (verl
examples/sglang_multiturn/config/tool_config/search_tool_config.yaml). Output is
deterministic; rerunning gives a byte-identical file.
"""

import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
import regex
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
OUT_DIR = os.path.join(FIXTURES, "hermes")

# --- verl's HermesToolParser, restated (verl/experimental/agent_loop/tool_parser.py) ------

TOOL_CALL = regex.compile(r"<tool_call>(.*?)</tool_call>", regex.DOTALL)


def extract_tool_calls(text):
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return text, []
    calls = []
    for match in TOOL_CALL.findall(text):
        try:
            call = json.loads(match)
            name, arguments = call["name"], call["arguments"]
            if not isinstance(name, str):  # pydantic v2's `name: str` refuses other types
                raise TypeError("name is not a string")
            calls.append({"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)})
        except Exception:
            pass
    return TOOL_CALL.sub("", text), calls


CALL = '{"name": "search", "arguments": {"query_list": ["capital of France"]}}'
PARSE_CASES = [
    ("no tags", "The answer is <answer>Paris</answer>.<|im_end|>"),
    ("an opening tag only", '<tool_call>\n{"name": "search", "arguments": {}}<|im_end|>'),
    ("a closing tag only", "done </tool_call><|im_end|>"),
    ("closing before opening", "</tool_call> then <tool_call><|im_end|>"),
    ("one call as Qwen2.5 writes it", f"I need to search.\n<tool_call>\n{CALL}\n</tool_call><|im_end|>"),
    (
        "two calls",
        f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n"
        '{"name": "search", "arguments": {"query_list": ["a", "b"]}}\n</tool_call><|im_end|>',
    ),
    ("not JSON", "<tool_call>\n{name: search}\n</tool_call> tail"),
    ("JSON with trailing data", f"<tool_call>{CALL} extra</tool_call>"),
    ("a list, not an object", "<tool_call>[1, 2]</tool_call>"),
    ("a string, not an object", '<tool_call>"search"</tool_call>'),
    ("no arguments key", '<tool_call>{"name": "search"}</tool_call>'),
    ("no name key", '<tool_call>{"arguments": {}}</tool_call>'),
    ("a name that is not a string", '<tool_call>{"name": 42, "arguments": {}}</tool_call>'),
    ("arguments that are a list", '<tool_call>{"name": "search", "arguments": ["q"]}</tool_call>'),
    ("arguments that are a string", '<tool_call>{"name": "search", "arguments": "q"}</tool_call>'),
    ("arguments that are null", '<tool_call>{"name": "search", "arguments": null}</tool_call>'),
    ("extra keys", '<tool_call>{"name": "search", "arguments": {}, "id": 7}</tool_call>'),
    ("duplicate keys: the last wins", '<tool_call>{"name": "a", "name": "b", "arguments": {}}</tool_call>'),
    ("an empty block", "x<tool_call></tool_call>y"),
    ("a byte-order mark before the JSON", f"<tool_call>\ufeff{CALL}</tool_call>"),
    ("whitespace around the JSON", f"<tool_call> \t\r\n{CALL}\r\n\t </tool_call>"),
    (
        "escapes and non-ASCII",
        '<tool_call>{"name": "search", "arguments": {"query_list": ["Z\\u00fcrich \\"old\\"", '
        '"北京 🚀", "tab\\there"]}}</tool_call>',
    ),
    ("a nested opening tag", f"<tool_call><tool_call>{CALL}</tool_call></tool_call>"),
    (
        "bad, good, bad",
        f"a<tool_call>{{</tool_call>b<tool_call>{CALL}</tool_call>c<tool_call>[]</tool_call>d",
    ),
    ("a control character inside a string", '<tool_call>{"name": "se\x01arch", "arguments": {}}</tool_call>'),
]

# --- verl's tool schema as the chat template receives it -----------------------------------

# Field order of verl's pydantic models (verl/tools/schemas.py); other keys are ignored
# (pydantic's default extra="ignore"), unset ones left out (exclude_unset=True).
SCHEMA_FIELDS = {
    "tool": ["type", "function"],
    "function": ["name", "description", "parameters", "strict"],
    "parameters": ["type", "properties", "required"],
    "property": ["type", "description", "enum"],
}


def model_dump(value, kind):
    out = {}
    for field in SCHEMA_FIELDS[kind]:
        if field not in value or value[field] is None:
            continue
        v = value[field]
        if kind == "tool" and field == "function":
            v = model_dump(v, "function")
        elif kind == "function" and field == "parameters":
            v = model_dump(v, "parameters")
        elif kind == "parameters" and field == "properties":
            v = {name: model_dump(p, "property") for name, p in v.items()}
        out[field] = v
    return out


with open(os.path.join(OUT_DIR, "search_tool_config.yaml"), encoding="utf-8") as f:
    TOOL_CONFIG = yaml.safe_load(f)
SEARCH_SCHEMA = model_dump(TOOL_CONFIG["tools"][0]["tool_schema"], "tool")

# --- transformers' chat-template environment -------------------------------------------------


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


def render(template, messages, tools, add_generation_prompt):
    return template.render(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt)


QUESTION = "Answer the given question. Question: who wrote the novel 1984?"
TOOL_TEXT = json.dumps(
    {"result": "Doc 1 (Title: Nineteen Eighty-Four)\nA novel by George Orwell.\n\nDoc 2 (Title: Orwell)\n\u00e9crivain"},
    ensure_ascii=False,
)
ASSISTANT_CALL = f'<tool_call>\n{{"name": "search", "arguments": {{"query_list": ["1984 novel author"]}}}}\n</tool_call>'
UNICODE_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Looks up a word (\u00e9t\u00e9, 北京) with \"quotes\", <tags> & a\nnewline.",
        "parameters": {
            "type": "object",
            "properties": {
                "word": {"type": "string", "description": "the word"},
                "limit": {"type": "integer", "enum": [1, 2, 3]},
            },
            "required": ["word"],
        },
        "strict": False,
    },
}
CHAT_CASES = [
    ("user only, search tool", [{"role": "user", "content": QUESTION}], [SEARCH_SCHEMA], True),
    (
        "system and user, search tool",
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": QUESTION}],
        [SEARCH_SCHEMA],
        True,
    ),
    ("two tools with non-ASCII text", [{"role": "user", "content": "hi"}], [SEARCH_SCHEMA, UNICODE_TOOL], True),
    ("an empty tool list renders as none", [{"role": "user", "content": QUESTION}], [], True),
    (
        "a tool turn after a call (verl's second prompt)",
        [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": ASSISTANT_CALL},
            {"role": "tool", "content": TOOL_TEXT},
        ],
        [SEARCH_SCHEMA],
        True,
    ),
    (
        "two tool responses in one user turn",
        [{"role": "tool", "content": TOOL_TEXT}, {"role": "tool", "content": "second"}],
        None,
        True,
    ),
    (
        "verl's system-prompt probe (one empty user message)",
        [{"role": "user", "content": ""}],
        None,
        False,
    ),
    (
        "assistant tool_calls as OpenAI messages carry them",
        [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "search", "arguments": {"query_list": ["a", "b"]}}}
                ],
            },
            {"role": "tool", "content": "r"},
        ],
        [SEARCH_SCHEMA],
        False,
    ),
]


def main():
    parse = []
    for name, text in PARSE_CASES:
        content, calls = extract_tool_calls(text)
        parse.append({"name": name, "text": text, "content": content, "calls": calls})

    with open(os.path.join(FIXTURES, "templates", "qwen2.5-instruct.jinja"), encoding="utf-8") as f:
        template = ENV.from_string(f.read())
    chat = []
    for name, messages, tools, gen in CHAT_CASES:
        text = render(template, messages, tools, gen)
        chat.append(
            {
                "name": name,
                "template": "qwen2.5-instruct",
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": gen,
                "text": text,
            }
        )

    reference = {
        "versions": {"jinja2": jinja2.__version__, "regex": regex.__version__},
        "parse": parse,
        "tool_schema": SEARCH_SCHEMA,
        "chat": chat,
    }
    path = os.path.join(OUT_DIR, "reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"wrote {path}: {len(parse)} parse cases, {len(chat)} chat cases")


if __name__ == "__main__":
    main()
