"""Vector stores (/v1/vector_stores): ingestion against raw embedding of the same text, and search
latency at 10k and 100k chunks, in one run.

The server runs in this process (the app on uvicorn's thread, as the extension serves it) with
the tests' scripted text host: nothing here generates text. Embeddings are the real model
(all-MiniLM-L6-v2 by default), on the CPU unless embedding_device says otherwise.

  ingestion  --docs English text files (--tokens cl100k tokens each, prose assembled from word
             lists by a seeded RNG) uploaded once with /v1/files; each round adds them all to a new
             vector store in one file batch and times the batch from its creation until it is
             completed: chunks/s, embedded pieces/s and MB/s of text. Beside it, in the same round,
             the same distinct pieces (on the grid ingestion cuts them on, 100 tokens for the default
             800/400 chunks: vector_stores/chunking.py, each embedded once) sent to /v1/embeddings
               - one request per document, one after another: what ingestion hands the batcher;
               - in requests of embedding_max_batch pieces from two clients at once: full batches,
                 the most the model gives through the API on this machine.
             Ingestion's pieces/s is printed as a ratio of each. Rounds alternate the order.
  search     a store of each of --sizes chunks (10,000 and 100,000), made through the API and then
             filled directly in the server's SQLite file (vector_store_files rows as ingestion
             writes them, and vector_chunks rows with seeded random unit vectors of the model's
             dimensions): embedding 100k chunks with the real model would take far too long here,
             and an exact search costs the same whatever the vectors hold. Each round moves the
             store's version, so its first search builds the index again (timed on its own), then
             times --searches searches of each kind, in turn: one query, one query with a filter
             on attributes, and a list of three queries (all real text, embedded by the model).
             For reference, parts of a search alone: one query embedded through /v1/embeddings, and,
             called in this process on the server's own objects, the index build (chunk_rows.matrix),
             the store look-up every search makes first (rows.touch) and the exact search
             (index.search), without and with the filter.

Everything shares the machine's cores with whatever else runs there: the load average at the
start and at the end is printed, and the p95s are the first figures to suffer.

    python bench/bench_vector_stores.py [--docs 10] [--tokens 3000] [--sizes 10000,100000] [--searches 50]
                                        [--chunks-per-file 20] [--rounds 3] [--skip-ingestion] [--skip-search]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from bench_concurrency import pct
from openai import OpenAI
from serving import ROOT

sys.path.insert(0, str(ROOT / "tests"))

# ---------------------------------------------------------------------------------------------
# text: varied English prose, the same for a given seed

TOPICS = {
    "rivers": ["flood", "bank", "current", "delta", "dam", "bridge", "ferry", "wetland", "levee", "harbour"],
    "farming": ["harvest", "orchard", "tractor", "wheat", "barn", "irrigation", "soil", "seed", "cattle", "market"],
    "finance": ["budget", "loan", "interest rate", "pension", "audit", "invoice", "dividend", "ledger", "bond", "tax"],
    "medicine": ["clinic", "vaccine", "surgeon", "trial", "dose", "ward", "diagnosis", "nurse", "symptom", "therapy"],
    "software": ["compiler", "database", "release", "server", "test suite", "cache", "protocol", "patch", "kernel",
                 "library"],
    "history": ["treaty", "empire", "archive", "manuscript", "siege", "dynasty", "monastery", "charter", "revolt",
                "census"],
    "astronomy": ["telescope", "comet", "orbit", "nebula", "eclipse", "satellite", "galaxy", "observatory", "planet",
                  "spectrum"],
    "cooking": ["recipe", "oven", "sauce", "dough", "spice", "kitchen", "broth", "pastry", "knife", "menu"],
}
SUBJECTS = ["The committee", "Our team", "The regional office", "Each volunteer", "The city council", "A small startup",
            "The research group", "Most readers", "The chief engineer", "The museum", "Local schools", "The inspector",
            "Her assistant", "The new director", "Several witnesses", "The national agency", "A retired teacher",
            "The board", "Two students", "The harbour master"]
VERBS = ["reviewed", "measured", "described", "rebuilt", "questioned", "published", "compared", "funded", "delayed",
         "improved", "replaced", "tested", "documented", "criticised", "approved", "inspected", "mapped", "simplified",
         "recorded", "defended"]
ADJECTIVES = ["old", "expensive", "unusual", "careful", "northern", "temporary", "damaged", "promising", "quiet",
              "official", "detailed", "rough", "modern", "seasonal", "fragile", "public", "private", "narrow",
              "familiar", "complicated"]
CLAUSES = ["after the storm of last winter", "before the annual budget was approved", "despite rising costs",
           "while the rest of the town slept", "during the second week of the survey", "without waiting for permission",
           "as the earlier report had suggested", "in spite of several objections", "once the weather improved",
           "because nobody else had the records", "under pressure from the press", "at the request of the mayor",
           "with help from the university", "for the third time this decade", "long after the deadline had passed"]
CONNECTIVES = ["However", "Meanwhile", "In the end", "For that reason", "Even so", "At first", "Later",
               "By contrast", "As a result", "Nevertheless"]
OUTCOMES = ["the results were better than anyone expected", "the costs doubled within a year",
            "the plan was quietly abandoned", "nobody could agree on what had gone wrong",
            "the figures had to be checked again", "a second study was commissioned",
            "the old method turned out to be more reliable", "the public lost interest",
            "the same mistake was repeated elsewhere", "the decision was reversed in the spring"]
QUERIES = ["how were the river floods measured after the storm", "why did the costs of the budget double",
           "which vaccine trial was delayed by the clinic", "what did the committee say about the database release",
           "who documented the treaty in the archive", "when was the telescope at the observatory repaired",
           "how do you make the sauce for the pastry", "what went wrong with the irrigation of the orchard",
           "the pension audit and the interest rate", "a second study of the comet's orbit",
           "why was the plan for the bridge abandoned", "the surgeon's diagnosis in the northern ward",
           "records of the siege kept by the monastery", "cache and kernel patch for the server",
           "the harvest market prices this season", "public objections to the new dam on the delta",
           "which recipe did the kitchen replace", "the census of the old empire",
           "satellite images of the galaxy spectrum", "the inspector's report on the damaged levee"]


def sentence(rng: random.Random, nouns: list[str]) -> str:
    n1, n2 = rng.sample(nouns, 2)
    s, v, a, c = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(ADJECTIVES), rng.choice(CLAUSES)
    forms = [
        f"{s} {v} the {a} {n1} {c}.",
        f"{rng.choice(CONNECTIVES)}, {s.lower()} {v} the {n1} and the {n2}, and {rng.choice(OUTCOMES)}.",
        f"According to {s.lower()}, the {n1} was more {a} than the {n2} {c}.",
        f"Nobody had {v} a {a} {n1} like this one since {rng.randint(1890, 2023)}.",
        f"{s} spent {rng.randint(2, 40)} days on the {n1}; {rng.choice(OUTCOMES)}.",
        f"Why was the {n1} {v} {c}? {s} never gave a clear answer.",
    ]
    return rng.choice(forms)


def document(rng: random.Random, topic: str, tokens: int, encoding) -> str:
    """Markdown prose of about ``tokens`` cl100k tokens on ``topic`` (a few paragraphs under headings)."""
    nouns = TOPICS[topic] + rng.sample([n for t in TOPICS.values() for n in t], 6)
    parts, count = [f"# Notes on the {rng.choice(ADJECTIVES)} {rng.choice(TOPICS[topic])}\n"], 0
    while count < tokens:
        if rng.random() < 0.15:
            parts.append(f"## {rng.choice(ADJECTIVES).capitalize()} {rng.choice(nouns)}s\n")
        paragraph = " ".join(sentence(rng, nouns) for _ in range(rng.randint(3, 8))) + "\n"
        parts.append(paragraph)
        count += len(encoding.encode_ordinary(paragraph))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# the server


def start_server(data_dir: str):
    from support.scripted import ScriptedHost

    from openai_ext.app import create_app
    from openai_ext.core.config import Settings
    from openai_ext.core.server import ApiServer

    settings = Settings(port=0, data_dir=data_dir)
    return ApiServer(create_app(settings, ScriptedHost()), settings).start(), settings


def batch_stats(http: httpx.Client) -> dict:
    r = http.get("/internal/embeddings/stats")
    r.raise_for_status()
    return r.json()


def mean_batch(before: dict, after: dict) -> float:
    return (after["inputs"] - before["inputs"]) / max(1, after["batches"] - before["batches"])


def embed(http: httpx.Client, texts: list[str]) -> None:
    r = http.post("/embeddings", json={"model": "text-embedding-3-small", "input": texts, "encoding_format": "base64"})
    if r.status_code != 200:
        raise SystemExit(f"/v1/embeddings answered {r.status_code}: {r.text[:300]}")


# ---------------------------------------------------------------------------------------------
# ingestion


def ingest_round(client: OpenAI, http: httpx.Client, db: Path, file_ids: list[str]) -> tuple[float, int, str]:
    """Seconds from the file batch's creation until it is completed, and the chunks stored."""
    store = client.vector_stores.create(name="bench ingestion")
    t0 = time.perf_counter()
    batch = client.vector_stores.file_batches.create(store.id, file_ids=file_ids)
    while True:
        b = http.get(f"/vector_stores/{store.id}/file_batches/{batch.id}").json()
        if b["status"] != "in_progress":
            break
        time.sleep(0.02)
    took = time.perf_counter() - t0
    if b["status"] != "completed" or b["file_counts"]["completed"] != len(file_ids):
        raise SystemExit(f"the file batch ended {b['status']}: {b['file_counts']}")
    with sqlite3.connect(db, timeout=30) as c:
        chunks = c.execute("SELECT count(*) FROM vector_chunks WHERE store_id = ?", (store.id,)).fetchone()[0]
    return took, chunks, store.id


def raw_per_document(http: httpx.Client, pieces: list[list[str]]) -> float:
    """Seconds to embed each document's pieces in one request, one document after another."""
    t0 = time.perf_counter()
    for doc in pieces:
        for i in range(0, len(doc), 256):   # ingestion's groups (EMBED_GROUP)
            embed(http, doc[i:i + 256])
    return time.perf_counter() - t0


def raw_full_batches(http: httpx.Client, pieces: list[str], size: int, clients: int = 2) -> float:
    """Seconds to embed ``pieces`` in requests of ``size`` from ``clients`` threads at once."""
    groups = [pieces[i:i + size] for i in range(0, len(pieces), size)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        with httpx.Client(base_url=str(http.base_url), timeout=600, headers=http.headers) as own:
            while True:
                with lock:
                    if not groups:
                        return
                    group = groups.pop()
                try:
                    embed(own, group)
                except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
                    errors.append(e)
                    return

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def ingestion(args: argparse.Namespace, client: OpenAI, http: httpx.Client, settings, db: Path) -> None:
    from openai_ext.core.token_tables import load_encoding
    from openai_ext.vector_stores.chunking import DEFAULT, chunks

    encoding = load_encoding()
    rng = random.Random(args.seed)
    topics = list(TOPICS)
    texts = [document(rng, topics[i % len(topics)], args.tokens, encoding) for i in range(args.docs)]
    t0 = time.perf_counter()
    cut = [chunks(t, encoding, DEFAULT["max_chunk_size_tokens"], DEFAULT["chunk_overlap_tokens"]) for t in texts]
    chunking_s = time.perf_counter() - t0
    # the distinct pieces of each document, as ingestion embeds them (overlapping chunks share theirs)
    pieces = [list(dict.fromkeys(p for c in doc for p in c.pieces)) for doc in cut]
    n_chunks, n_pieces = sum(len(d) for d in cut), sum(len(p) for p in pieces)
    n_bytes = sum(len(t.encode()) for t in texts)
    n_tokens = sum(len(encoding.encode_ordinary(t)) for t in texts)
    embedded = sum(len(encoding.encode_ordinary(p)) for doc in pieces for p in doc)
    file_ids = [client.files.create(file=(f"doc{i:04d}.md", t.encode()), purpose="assistants").id
                for i, t in enumerate(texts)]
    flat = [p for doc in pieces for p in doc]
    print(f"ingestion: {args.docs} documents, {n_tokens:,} tokens, {n_bytes / 1e6:.2f} MB of text; "
          f"{n_chunks} chunks of {DEFAULT['max_chunk_size_tokens']} tokens (overlap "
          f"{DEFAULT['chunk_overlap_tokens']}), {n_pieces} distinct pieces "
          f"({embedded / max(1, n_tokens):.2f}x the text's tokens embedded); {args.rounds} rounds", flush=True)
    embed(http, flat[:8])   # loads the model
    results: dict[str, list[float]] = {"ingestion": [], "per document": [], "full batches": []}
    batches: dict[str, list[float]] = {k: [] for k in results}
    ratios: dict[str, list[float]] = {"per document": [], "full batches": []}
    for r in range(args.rounds):
        order = list(results) if r % 2 == 0 else list(reversed(results))   # drift hits all alike
        took: dict[str, float] = {}
        for way in order:
            before = batch_stats(http)
            if way == "ingestion":
                took[way], stored, store_id = ingest_round(client, http, db, file_ids)
                if stored != n_chunks:
                    print(f"  note: the store holds {stored} chunks where chunking.py cuts {n_chunks}")
                client.vector_stores.delete(store_id)
            elif way == "per document":
                took[way] = raw_per_document(http, pieces)
            else:
                took[way] = raw_full_batches(http, flat, settings.embedding_max_batch)
            batches[way].append(mean_batch(before, batch_stats(http)))
            results[way].append(took[way])
        for way in ratios:
            ratios[way].append(took[way] / took["ingestion"])
        print(f"  round {r + 1}: " + ", ".join(f"{k} {n_pieces / v:.1f} pieces/s" for k, v in took.items()), flush=True)
    t = statistics.median(results["ingestion"])
    print(f"\n  {'':34} {'seconds':>8} {'chunks/s':>9} {'pieces/s':>9} {'MB/s':>7} {'batch':>6}")
    print(f"  {'ingestion (file batch)':34} {t:8.2f} {n_chunks / t:9.1f} {n_pieces / t:9.1f} "
          f"{n_bytes / 1e6 / t:7.3f} {statistics.median(batches['ingestion']):6.1f}")
    for way, label in (("per document", "/v1/embeddings, a request a document"),
                       ("full batches", f"/v1/embeddings, {settings.embedding_max_batch} a request x 2")):
        s = statistics.median(results[way])
        print(f"  {label:34} {s:8.2f} {'':9} {n_pieces / s:9.1f} {'':7} {statistics.median(batches[way]):6.1f}   "
              f"ingestion x{statistics.median(ratios[way]):.2f} of it")
    print(f"  {'chunking alone (in process)':34} {chunking_s:8.2f}   ({chunking_s / t:.1%} of ingestion's time: "
          "cl100k tokens, windows and pieces, as ingestion cuts them)")
    print("  (medians over rounds; ratios: raw seconds / ingestion seconds, per round; batch: mean pieces per encode "
          "call, from the server's embedding batcher counters)")


# ---------------------------------------------------------------------------------------------
# search

FILTER = {"type": "and", "filters": [{"type": "eq", "key": "category", "value": "finance"},
                                     {"type": "gte", "key": "year", "value": 2015}]}
CHUNKING = {"type": "static", "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}}


def file_attributes(f: int) -> dict:
    return {"category": list(TOPICS)[f % len(TOPICS)], "year": 2000 + f % 25, "public": f % 3 == 0}


def fill(db: Path, store_id: str, n: int, per_file: int, dim: int, seed: int) -> int:
    """``n`` chunks in ``per_file``-chunk completed files of ``store_id``, straight into the store's
    SQLite; the store's version moves. The number of files."""
    rng = np.random.default_rng(seed)
    now = time.time()
    files = (n + per_file - 1) // per_file
    c = sqlite3.connect(db, timeout=60)
    try:
        for f in range(files):
            file_id = f"file-synthetic{f:07d}"
            count = min(per_file, n - f * per_file)
            vectors = rng.standard_normal((count, dim), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            texts = [f"Synthetic chunk {s} of {file_id}: a short stand-in text." for s in range(count)]
            usage = sum(len(t.encode()) for t in texts) + int(vectors.nbytes)
            attributes = file_attributes(f)
            body = {"filename": f"synthetic{f:07d}.md", "chunking_strategy": CHUNKING, "attributes": attributes}
            c.execute("INSERT INTO vector_store_files (store_id, file_id, created_at, status, batch_id, instance, "
                      "usage_bytes, body) VALUES (?, ?, ?, 'completed', NULL, NULL, ?, ?)",
                      (store_id, file_id, now + f * 1e-6, usage, json.dumps(body, separators=(",", ":"))))
            c.executemany("INSERT INTO vector_chunks (store_id, file_id, seq, text, vector) VALUES (?, ?, ?, ?, ?)",
                          [(store_id, file_id, s, texts[s], vectors[s].tobytes()) for s in range(count)])
            if f % 100 == 99:
                c.commit()   # short transactions: the server's own writes (its heartbeat) wait for none long
        c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
        c.commit()
    finally:
        c.close()
    return files


def bump(db: Path, store_id: str) -> None:
    with sqlite3.connect(db, timeout=60) as c:
        c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))


def timed_search(http: httpx.Client, store_id: str, body: dict) -> float:
    t0 = time.perf_counter()
    r = http.post(f"/vector_stores/{store_id}/search", json=body)
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"search answered {r.status_code}: {r.text[:300]}")
    data = r.json()["data"]
    if len(data) != body.get("max_num_results", 10):
        raise SystemExit(f"search found {len(data)} results: {body}")
    if "filters" in body and any(d["attributes"]["category"] != "finance" or d["attributes"]["year"] < 2015
                                 for d in data):
        raise SystemExit("a result does not pass the filter")
    return took


def search_bench(args: argparse.Namespace, client: OpenAI, http: httpx.Client, server, db: Path) -> None:
    from openai_ext.vector_stores.filters import Compound, holds
    from openai_ext.vector_stores.index import search

    state = server.app.state.api
    dim = 384
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = {
        "query": lambda i: {"query": QUERIES[i % len(QUERIES)]},
        "query + filters": lambda i: {"query": QUERIES[i % len(QUERIES)], "filters": FILTER},
        "3 queries": lambda i: {"query": [QUERIES[(i + k) % len(QUERIES)] for k in range(3)]},
    }
    embed(http, ["warm up"])   # loads the model
    rows = []
    for n in sizes:
        store = client.vector_stores.create(name=f"bench search {n}")
        t0 = time.perf_counter()
        files = fill(db, store.id, n, args.chunks_per_file, dim, args.seed + n)
        filled = time.perf_counter() - t0
        first: list[float] = []
        times: dict[str, list[float]] = {k: [] for k in kinds}
        embed_one: list[float] = []
        raw: dict[str, list[float]] = {"index build": [], "store look-up": [], "numpy search": [],
                                       "numpy search + filters": []}
        for r in range(args.rounds):
            if r:
                bump(db, store.id)   # the next search builds the index again
            first.append(timed_search(http, store.id, kinds["query"](r)))
            for i in range(args.searches):
                for kind, body in kinds.items():
                    times[kind].append(timed_search(http, store.id, body(i + r)))
                t1 = time.perf_counter()
                embed(http, [QUERIES[i % len(QUERIES)]])
                embed_one.append(time.perf_counter() - t1)
        # parts of a search alone, called in this process: the store's matrix as the server builds
        # it, the store's look-up every search makes first (a write: last_active_at), and the search
        for _ in range(args.rounds):
            t1 = time.perf_counter()
            matrix, _ = state.vector_stores.chunk_rows.matrix(store.id)
            raw["index build"].append(time.perf_counter() - t1)
        for _ in range(args.searches):
            t1 = time.perf_counter()
            state.vector_stores.rows.touch(store.id, None)
            raw["store look-up"].append(time.perf_counter() - t1)
        filters = Compound.model_validate(FILTER)
        qs = np.random.default_rng(args.seed).standard_normal((args.searches, dim), dtype=np.float32)
        qs /= np.linalg.norm(qs, axis=1, keepdims=True)
        for q in qs:
            for name, f in (("numpy search", None), ("numpy search + filters", filters)):
                t1 = time.perf_counter()
                search(matrix, q[None, :], filters=f, threshold=0.0, most=10)
                raw[name].append(time.perf_counter() - t1)
        rows.append((n, files, filled, first, times, embed_one, raw))
        client.vector_stores.delete(store.id)

    print("\nsearch: POST /v1/vector_stores/{id}/search, max_num_results 10, real text queries embedded by the model. "
          "The chunks' vectors are SYNTHETIC (seeded random unit vectors of 384 dimensions, written straight into "
          "the store): the search is exact (one matrix-vector product over every chunk), so its cost does not "
          "depend on the vectors' values.")
    filters = Compound.model_validate(FILTER)
    print(f"  filters: {json.dumps(FILTER)}; {args.chunks_per_file} chunks a file; {args.searches} searches of each "
          f"kind a round, {args.rounds} rounds, the kinds in turn")
    for n, files, filled, first, times, embed_one, raw in rows:
        passing = sum(holds(filters, file_attributes(f)) for f in range(files))
        print(f"\n  {n:,} chunks in {files:,} files (written in {filled:.1f} s; {passing} files pass the filters)")
        print(f"    {'':40} {'p50 ms':>8} {'p95 ms':>8}")
        print(f"    {'first search (builds the index)':40} {statistics.median(first) * 1000:8.1f} "
              f"{'':8}  (median of {len(first)} rounds: {', '.join(f'{x * 1000:.0f}' for x in first)} ms)")
        for kind, values in times.items():
            print(f"    {'search, ' + kind:40} {pct(values, 0.5) * 1000:8.1f} {pct(values, 0.95) * 1000:8.1f}")
        print("    for reference, parts of a search alone:")
        print(f"    {'  embed 1 query (/v1/embeddings)':40} {pct(embed_one, 0.5) * 1000:8.1f} "
              f"{pct(embed_one, 0.95) * 1000:8.1f}")
        for name, values in raw.items():
            print(f"    {'  ' + name + ' (in process)':40} {pct(values, 0.5) * 1000:8.2f} "
                  f"{pct(values, 0.95) * 1000:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=10, help="documents ingested")
    ap.add_argument("--tokens", type=int, default=3000, help="cl100k tokens a document")
    ap.add_argument("--sizes", default="10000,100000", help="chunks in the searched stores")
    ap.add_argument("--chunks-per-file", type=int, default=20)
    ap.add_argument("--searches", type=int, default=50, help="searches of each kind a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-ingestion", action="store_true")
    ap.add_argument("--skip-search", action="store_true")
    args = ap.parse_args()

    import torch
    began, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as data:
        server, settings = start_server(data)
        db = Path(data) / "responses.sqlite3"
        print(f"in-process server (scripted text host), embeddings: {settings.embedding_model or 'all-MiniLM-L6-v2'} "
              f"on {settings.embedding_device}, torch {torch.__version__} with {torch.get_num_threads()} threads, "
              f"{os.cpu_count()} cores; SQLite store in data_dir", flush=True)
        try:
            client = OpenAI(base_url=server.url, api_key="bench", max_retries=0, timeout=600)
            with httpx.Client(base_url=server.url, timeout=600, headers={"Authorization": "Bearer bench"}) as http:
                if not args.skip_ingestion:
                    ingestion(args, client, http, settings, db)
                if not args.skip_search:
                    search_bench(args, client, http, server, db)
        finally:
            server.stop()
    print(f"\n(took {time.perf_counter() - began:.0f} s; load average {load:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end, on {os.cpu_count()} cores: other processes share the CPU with this "
          "run when the load is above what it adds itself, about 1-2)")


if __name__ == "__main__":
    main()
