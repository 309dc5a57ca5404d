"""Drives serve-engine's OpenAI API with the official `openai` Python package.

Run by test/engine/openai.test.ts (which skips it when `import openai` fails): reads a JSON
spec on stdin, makes the calls below with the client, and prints what the client returned
(its pydantic objects dumped to JSON, or the class of the exception it raised) as one JSON
object. The test compares it with /generate and the chat template on the same server.

spec: {"base", "key", "model", "messages", "tools_base", "tools_model", "tools", "ask",
       "forced_tools", "schema", "choices"}
"""

import json
import sys

import openai


def main() -> None:
    spec = json.load(sys.stdin)
    client = openai.OpenAI(base_url=spec["base"] + "/v1", api_key=spec["key"], max_retries=0)
    out = {"version": openai.__version__}

    out["models"] = client.models.list().model_dump()["data"]

    chat = client.chat.completions.create(
        model=spec["model"], messages=spec["messages"], temperature=0, max_tokens=40
    )
    out["chat"] = chat.model_dump()

    stream = client.chat.completions.create(
        model=spec["model"],
        messages=spec["messages"],
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    out["stream"] = {"text": text, "finish_reason": finish, "usage": usage}

    completion = client.completions.create(
        model=spec["model"], prompt="The capital of France is", temperature=0, max_tokens=8
    )
    out["completion"] = completion.model_dump()

    try:
        openai.OpenAI(
            base_url=spec["base"] + "/v1", api_key="sk-wrong", max_retries=0
        ).models.list()
        out["wrong_key"] = None
    except openai.APIStatusError as e:
        out["wrong_key"] = {"class": type(e).__name__, "status": e.status_code, "code": e.code}

    try:
        client.chat.completions.create(model=spec["model"], messages=[], max_tokens=4)
        out["bad_request"] = None
    except openai.APIStatusError as e:
        out["bad_request"] = {"class": type(e).__name__, "status": e.status_code}

    tools = openai.OpenAI(base_url=spec["tools_base"] + "/v1", api_key="unused", max_retries=0)
    called = tools.chat.completions.create(
        model=spec["tools_model"], messages=spec["ask"], tools=spec["tools"]
    )
    out["tool_call"] = called.model_dump()

    streamed_calls, finish = [], None
    for chunk in tools.chat.completions.create(
        model=spec["tools_model"], messages=spec["ask"], tools=spec["tools"], stream=True
    ):
        for choice in chunk.choices:
            streamed_calls += [c.model_dump() for c in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    out["tool_call_stream"] = {"tool_calls": streamed_calls, "finish_reason": finish}

    # Constrained decoding on the real engine: a named function, then a JSON Schema.
    forced = client.chat.completions.create(
        model=spec["model"],
        messages=spec["messages"],
        tools=spec["forced_tools"],
        tool_choice={"type": "function", "function": {"name": spec["forced_tools"][0]["function"]["name"]}},
        temperature=0,
        max_tokens=300,
    )
    out["forced"] = forced.model_dump()
    formatted = client.chat.completions.create(
        model=spec["model"],
        messages=spec["messages"],
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": spec["schema"]}},
        temperature=0,
        max_tokens=300,
    )
    out["formatted"] = formatted.model_dump()
    # vLLM's structured outputs, sent as vLLM's docs send them (extra_body).
    chosen = client.completions.create(
        model=spec["model"],
        prompt="Pick one:",
        temperature=1,
        seed=3,
        n=3,
        max_tokens=16,
        extra_body={"structured_outputs": {"choice": spec["choices"]}},
    )
    out["chosen"] = chosen.model_dump()

    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
