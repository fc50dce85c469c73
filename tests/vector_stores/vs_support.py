"""What the vector store tests share: documents on distinct topics (one of each format a store
reads, a PDF built by hand), uploads, raw calls with a key, and polls that wait for ingestion."""

from __future__ import annotations

import json

import httpx
from support.pdf import one_page
from support.servers import wait_until

KEY_A, KEY_B = "key-a", "key-b"


def pdf(text: str) -> bytes:
    return one_page(text)


VOLCANO = "Volcanoes erupt molten lava, ash and hot gases from deep inside the Earth."
DOCS = {
    "cats.md": b"# Cats\n\nCats are small domesticated felines. They purr, chase mice and sleep most of the day.\n",
    "rockets.txt": b"Rockets burn liquid oxygen and kerosene to lift satellites into orbit around the Earth.\n",
    "bread.html": b"<!doctype html><html><head><title>Baking</title><style>p { color: red }</style></head><body>"
                  b"<h1>Sourdough bread</h1><p>Knead the dough, let it rise overnight and bake the loaf in a hot "
                  b"oven.</p><script>var secret = 1;</script></body></html>",
    "weather.json": json.dumps({"forecast": "Heavy rain and thunderstorms are expected tomorrow, with strong "
                                            "winds."}).encode(),
    "volcano.pdf": pdf(VOLCANO),
}
# a query for each document that only it answers
QUERIES = {"cats.md": "pets that purr", "rockets.txt": "launching a spacecraft to orbit",
           "bread.html": "how do I bake a loaf", "weather.json": "will there be a storm tomorrow",
           "volcano.pdf": "lava eruption"}


def upload(client, name: str, data: bytes) -> str:
    return client.files.create(file=(name, data), purpose="assistants").id


def upload_all(client, docs: dict[str, bytes] = DOCS) -> dict[str, str]:
    """Each document uploaded: name -> file id."""
    return {name: upload(client, name, data) for name, data in docs.items()}


def raw(server, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=120, **kw)


def settled(client, store_id: str):
    """The store once no file in it is in progress (polled: progress is asserted, never a duration)."""
    box = {}

    def done() -> bool:
        box["s"] = client.vector_stores.retrieve(store_id)
        return box["s"].status != "in_progress"
    wait_until(done, f"vector store {store_id} is ingested", tries=2400)
    return box["s"]


def batch_settled(client, store_id: str, batch_id: str):
    box = {}

    def done() -> bool:
        box["b"] = client.vector_stores.file_batches.retrieve(batch_id, vector_store_id=store_id)
        return box["b"].status != "in_progress"
    wait_until(done, f"file batch {batch_id} ends", tries=2400)
    return box["b"]


def found_ids(client, store_id: str, query: str = "anything", **kw) -> set[str]:
    """The files a search returns with every chunk let through (no threshold, 50 results)."""
    return {r.file_id for r in client.vector_stores.search(store_id, query=query, max_num_results=50, **kw).data}
