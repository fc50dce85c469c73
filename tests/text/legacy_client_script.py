"""Runs inside a virtual environment with the legacy client, openai 0.28, configured the old way
(OPENAI_API_BASE and OPENAI_API_KEY in the environment), and prints what it got as JSON."""

import json
import sys

import openai  # 0.28: reads OPENAI_API_BASE / OPENAI_API_KEY when imported

assert openai.version.VERSION.startswith("0."), openai.version.VERSION
out = {"api_base": openai.api_base}

models = openai.Model.list()
out["models"] = [m["id"] for m in models["data"]]
out["engines"] = [e["id"] for e in openai.Engine.list()["data"]]

c = openai.Completion.create(model="text-davinci-003", prompt="Once upon a time", max_tokens=5, temperature=0)
out["completion"] = {"text": c["choices"][0]["text"], "finish": c["choices"][0]["finish_reason"],
                     "usage": c["usage"]["completion_tokens"]}
c = openai.Completion.create(engine="text-davinci-003", prompt="Once upon a time", max_tokens=5, temperature=0)
out["engine_completion"] = c["choices"][0]["text"]

chat = openai.ChatCompletion.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "Say hi."}],
                                    max_tokens=8, temperature=0)
out["chat"] = {"content": chat["choices"][0]["message"]["content"], "role": chat["choices"][0]["message"]["role"]}

parts = []
for chunk in openai.ChatCompletion.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=8, temperature=0, stream=True):
    parts.append(chunk["choices"][0]["delta"].get("content", ""))
out["chat_stream"] = "".join(parts)

emb = openai.Embedding.create(model="text-embedding-ada-002", input=["hello world", "goodbye"])
out["embedding"] = {"n": len(emb["data"]), "dims": len(emb["data"][0]["embedding"]), "model": emb["model"]}

edit = openai.Edit.create(model="text-davinci-edit-001", input="I has a apple.", instruction="Fix the grammar.",
                          temperature=0)
out["edit"] = {"object": edit["object"], "text": edit["choices"][0]["text"]}

try:
    openai.ChatCompletion.create(model="x", messages=[], max_tokens=2)
except openai.error.InvalidRequestError as e:
    out["error"] = {"status": e.http_status, "param": e.param, "message": str(e)}

json.dump(out, sys.stdout)
