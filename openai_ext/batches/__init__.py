"""The Batch API (/v1/batches): a JSONL file of requests run through the server's own front door
beside live clients, its results kept as they come."""

from .routes import router
from .service import BatchesService

__all__ = ["BatchesService", "router"]
