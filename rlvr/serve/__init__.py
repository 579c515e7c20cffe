"""``rlvr serve``: the engine core (``rlvr/rollout/core.py``) behind an HTTP server.

- ``protocol.py``: the request bodies, with SGLang's and vLLM's field names; bad input is a 400
  naming the field.
- ``state.py``: the engine, the limits, and one request's path (submit, disconnect, timeout, abort).
- ``app.py``: the FastAPI app and SGLang's native routes; ``openai_routes.py``: OpenAI's ``/v1``.
- ``runner.py``: loading the model of a config and running uvicorn.

docs/serve.md lists the routes and where they differ from SGLang and vLLM.
"""

from rlvr.serve.app import build_app
from rlvr.serve.state import Server

__all__ = ["build_app", "Server"]
