"""Test double of modules.chat (see ../README.md)."""

import copy

import jinja2

CALLS = []


def generate_chat_prompt(user_input, state, **kwargs):
    CALLS.append((user_input, copy.deepcopy(state)))
    history = kwargs.get("history", state["history"])["internal"]
    messages = []
    if state["mode"] == "instruct" and state["custom_system_message"].strip():
        messages.append({"role": "system", "content": state["custom_system_message"]})
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
    template = jinja2.Environment().from_string(state["instruction_template_str"])
    return template.render(messages=messages, add_generation_prompt=True)


def get_stopping_strings(state):
    return ["<|im_end|>"]
