"""The store's tables, as one list of named steps for both databases (core/migrations.py): a
version number means the same tables in SQLite and in PostgreSQL. A change is a new step
appended here, never an edit of one."""

from __future__ import annotations

from ..core.migrations import Step

# SQLite's first step is the schema of before versions existed, all "IF NOT EXISTS": a data folder
# written then (version 0, the same tables) keeps its rows.
SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    status TEXT NOT NULL, previous_response_id TEXT, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_time ON responses(updated_at);
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, response_id TEXT NOT NULL, item_id TEXT NOT NULL,
    role TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_response ON items(response_id, role, seq);
CREATE INDEX IF NOT EXISTS items_by_id ON items(item_id);
CREATE TABLE IF NOT EXISTS events (
    response_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (response_id, seq));
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    metadata TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversations_by_time ON conversations(updated_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversation_items_by_id ON conversation_items(conversation_id, item_id);
"""

POSTGRES_SCHEMA = """
CREATE TABLE responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, previous_response_id TEXT, body TEXT NOT NULL,
    instance TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0);
CREATE INDEX responses_by_time ON responses(updated_at);
CREATE INDEX responses_by_status ON responses(status);
CREATE TABLE items (
    seq BIGSERIAL PRIMARY KEY, response_id TEXT NOT NULL, item_id TEXT NOT NULL, role TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX items_by_response ON items(response_id, role, seq);
CREATE INDEX items_by_id ON items(item_id);
CREATE TABLE events (
    response_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (response_id, seq));
CREATE TABLE conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, metadata TEXT NOT NULL);
CREATE INDEX conversations_by_time ON conversations(updated_at);
CREATE TABLE conversation_items (
    seq BIGSERIAL PRIMARY KEY, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX conversation_items_by_id ON conversation_items(conversation_id, item_id);
CREATE TABLE instances (
    id TEXT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL, heartbeat_at DOUBLE PRECISION NOT NULL);
"""

# Several servers on one store: which server runs a response, whether another asked it to stop,
# and the servers alive (a heartbeat each), so a server only fails the responses of dead ones.
SQLITE_INSTANCES = """
ALTER TABLE responses ADD COLUMN instance TEXT;
ALTER TABLE responses ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
CREATE INDEX responses_by_status ON responses(status);
CREATE TABLE instances (id TEXT PRIMARY KEY, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL);
"""


# Uploaded files (the Files API, openai_ext/files/): their records; the contents are in files_dir.
FILES = """
CREATE TABLE files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at {time} NOT NULL, expires_at {time},
    bytes BIGINT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL);
CREATE INDEX files_by_owner ON files(owner, created_at);
CREATE INDEX files_by_expiry ON files(expires_at);
"""

# Batches (openai_ext/batches/): the Batch object, which instance runs it, and each line's result
# as it comes (so a restart goes on from the lines not yet done).
BATCHES = """
CREATE TABLE batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at {time} NOT NULL, status TEXT NOT NULL,
    instance TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX batches_by_owner ON batches(owner, created_at);
CREATE INDEX batches_by_status ON batches(status);
CREATE TABLE batch_lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (batch_id, line));
"""

# Vector stores (openai_ext/vector_stores/): the store, each file in it (its ingestion claimed by one
# instance, as batches are), file batches, and each chunk's text and vector (float32 bytes). The
# store's version moves with every change a search reads, so each instance knows when its
# in-memory index is stale.
VECTOR_STORES = """
CREATE TABLE vector_stores (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at {time} NOT NULL, last_active_at {time} NOT NULL,
    version BIGINT NOT NULL DEFAULT 0, body TEXT NOT NULL);
CREATE INDEX vector_stores_by_owner ON vector_stores(owner, created_at);
CREATE TABLE vector_store_files (
    store_id TEXT NOT NULL, file_id TEXT NOT NULL, created_at {time} NOT NULL, status TEXT NOT NULL,
    batch_id TEXT, instance TEXT, usage_bytes BIGINT NOT NULL DEFAULT 0, body TEXT NOT NULL,
    PRIMARY KEY (store_id, file_id));
CREATE INDEX vector_store_files_by_status ON vector_store_files(status, created_at);
CREATE INDEX vector_store_files_by_batch ON vector_store_files(batch_id);
CREATE TABLE vector_store_file_batches (
    id TEXT PRIMARY KEY, store_id TEXT NOT NULL, created_at {time} NOT NULL,
    cancelled INTEGER NOT NULL DEFAULT 0);
CREATE TABLE vector_chunks (
    store_id TEXT NOT NULL, file_id TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL,
    vector {blob} NOT NULL, PRIMARY KEY (store_id, file_id, seq));
"""

STEPS: tuple[Step, ...] = (
    Step("schema", sqlite=SQLITE_SCHEMA, postgres=POSTGRES_SCHEMA),
    # PostgreSQL's schema step had these from its first release: nothing to do there
    Step("instances", sqlite=SQLITE_INSTANCES, postgres=None),
    Step("files", sqlite=FILES.format(time="REAL"), postgres=FILES.format(time="DOUBLE PRECISION")),
    Step("batches", sqlite=BATCHES.format(time="REAL"), postgres=BATCHES.format(time="DOUBLE PRECISION")),
    Step("vector_stores", sqlite=VECTOR_STORES.format(time="REAL", blob="BLOB"),
         postgres=VECTOR_STORES.format(time="DOUBLE PRECISION", blob="BYTEA")),
)
