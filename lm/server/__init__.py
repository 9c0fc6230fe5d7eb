"""An OpenAI-compatible HTTP server over a local `JaxGenerator`, so a JAX checkpoint serves any role.

In parts, as vLLM's `entrypoints/openai/`: `protocol` (the request models whose validators give
the 400s, and the error shape), `responses` (bodies and server-sent events), `batcher` (requests
answered in fair batches, streamed ones as their tokens are made; no HTTP), `app` (the routes, the
HTTP server and `serve`), `config` (`ServerConfig`). docs/serving.md has the details.
"""

from lm.server.app import OpenAIServer, serve, server_from_config
from lm.server.config import ServerConfig
from lm.server.protocol import ApiError, error_body
from lm.server.responses import text_pieces

__all__ = [
  "ApiError",
  "OpenAIServer",
  "ServerConfig",
  "error_body",
  "serve",
  "server_from_config",
  "text_pieces",
]
