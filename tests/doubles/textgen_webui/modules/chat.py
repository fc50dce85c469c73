"""Test double of modules.chat (see ../README.md).

As the host's: instruct mode renders ``instruction_template_str`` with the system message
first; chat mode renders ``chat_template_str`` with the character's context, the names and the
user's bio; chat-instruct wraps the chat-mode prompt into the instruct template with the
``chat-instruct_command``. ``_continue`` leaves the last assistant message open. The template
gets ``enable_thinking`` and ``reasoning_effort`` from the state. The stop strings are found
the way the host finds them, from what the template writes between messages."""

import copy

import jinja2

CALLS = []
# The host's characters folder: name -> (name2, greeting, context)
CHARACTERS = {"Assistant": ("AI", "How can I help you today?", "The following is a conversation with an AI."),
              "Pirate": ("Captain Flint", "Ahoy!", "Captain Flint is a pirate who answers in pirate speak.")}
# The host's instruction-templates folder
INSTRUCTION_TEMPLATES = {
    "Alpaca": "{%- for message in messages %}{%- if message['role'] == 'user' %}{{ '### Instruction:\\n' + "
              "message['content'] + '\\n\\n' }}{%- elif message['role'] == 'assistant' %}{{ '### Response:\\n' + "
              "message['content'] + '\\n\\n' }}{%- else %}{{ message['content'] + '\\n\\n' }}{%- endif %}{%- endfor %}"
              "{%- if add_generation_prompt %}{{ '### Response:\\n' }}{%- endif %}",
}


def _render(template, **kwargs):
    return jinja2.Environment().from_string(template).render(**kwargs)


def _messages(state, history, user_input, system):
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    for user, assistant, tool, meta in (row + [""] * (4 - len(row)) for row in history):
        if meta and meta.get("role") == "system":
            messages.append({"role": "system", "content": user})
            continue
        if user.strip():
            messages.append({"role": "user", "content": user.strip()})
        if assistant.strip():
            messages.append({"role": "assistant", "content": assistant.strip()})
        if tool.strip():
            messages.append({"role": "tool", "content": tool.strip()})
    if user_input.strip():
        messages.append({"role": "user", "content": user_input.strip()})
    return messages


def generate_chat_prompt(user_input, state, **kwargs):
    CALLS.append((user_input, copy.deepcopy(state)))
    history = kwargs.get("history", state["history"])["internal"]
    _continue = kwargs.get("_continue", False)
    mode = state["mode"]
    thinking = {"enable_thinking": state["enable_thinking"], "reasoning_effort": state["reasoning_effort"]}
    if mode == "instruct":
        messages = _messages(state, history, user_input, state["custom_system_message"].strip())
        prompt = _render(state["instruction_template_str"], messages=messages,
                         add_generation_prompt=not _continue, **thinking)
    else:
        messages = _messages(state, history, user_input, state["context"].strip())
        prompt = _render(state["chat_template_str"], messages=messages, add_generation_prompt=not _continue,
                         name1=state["name1"], name2=state["name2"], user_bio=state["user_bio"])
        if mode == "chat-instruct":
            command = state["chat-instruct_command"].replace("<|character|>", state["name2"])
            command = command.replace("<|prompt|>", prompt)
            prompt = _render(state["instruction_template_str"], messages=[{"role": "user", "content": command}],
                             add_generation_prompt=True, **thinking) + f"{state['name2']}:"
    if _continue:
        prompt = prompt.rstrip()
        for end in get_stopping_strings(state):
            if prompt.endswith(end):
                prompt = prompt[:-len(end)].rstrip()
    from . import shared, text_generation
    if shared.tokenizer is not None:
        # as the host's: the prompt's length is counted for its truncation (get_encoded_length),
        # which on llama.cpp asks llama-server's /tokenize
        text_generation.encode(prompt)
    return prompt


def get_stopping_strings(state):
    """As the host's: the text the template writes after each message, up to its first
    bracketed tag or name (both templates in chat-instruct mode)."""
    renderers = []
    if state["mode"] in ("instruct", "chat-instruct"):
        renderers.append(lambda messages: _render(state["instruction_template_str"], messages=messages,
                                                  add_generation_prompt=False))
    if state["mode"] == "chat":
        renderers.append(lambda messages: _render(state["chat_template_str"], messages=messages,
                                                  add_generation_prompt=False, name1=state["name1"],
                                                  name2=state["name2"], user_bio=state.get("user_bio", "")))
    fake = [{"role": "user", "content": "first user message"},
            {"role": "assistant", "content": "first assistant message"},
            {"role": "user", "content": "second user message"},
            {"role": "assistant", "content": "second assistant message"}]
    found = []
    for render in renderers:
        prompt = render(fake)
        texts = [prompt[prompt.find("first user message") + 18:prompt.find("first assistant message")],
                 prompt[prompt.find("first assistant message") + 23:prompt.find("second user message")],
                 prompt[prompt.find("second assistant message") + 24:]]
        for text in texts:
            stripped = text.strip()
            for open_, close in (("<", ">"), ("[", "]"), ("(", ")"), ("{", "}")):
                if stripped.startswith(open_) and close in stripped:
                    found.append(stripped.split(close)[0] + close)
                    break
            else:
                if ":" in text:
                    found.append(text.split(":")[0] + ":")
    return sorted({s for s in found if not any(s.startswith(o) and s != o for o in found)})


def load_character_memoized(character, name1, name2):
    """As the host's: (name1, name2, picture, greeting, context)."""
    bot, greeting, context = CHARACTERS[character]
    return name1, bot, None, greeting, context


def load_instruction_template_memoized(template):
    return INSTRUCTION_TEMPLATES[template]
