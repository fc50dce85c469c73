"""The Files API (/v1/files): uploads kept beside the store of responses, for the platform APIs
built on them."""

from .routes import router
from .service import FilesService

__all__ = ["FilesService", "router"]
