"""The REST service: ``create_app(memory)`` builds the FastAPI application ``hybridmem serve`` runs.

:mod:`~hybridmem.server.app` holds the routes; :mod:`~hybridmem.server.proxy` the OpenAI-compatible
ones (chat completions relayed to the configured endpoint, with the user's memory);
:mod:`~hybridmem.server.asgi` the ASGI plumbing under them (body limits, error bodies, the request
queue); :mod:`~hybridmem.server.metrics` the Prometheus metrics at ``/metrics``. All use only the
public API.
"""

from hybridmem.server.app import create_app
from hybridmem.server.metrics import Metrics

__all__ = ["Metrics", "create_app"]
