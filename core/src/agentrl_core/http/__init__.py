"""The HTTP kit shared by the control plane, the engine and driver plugins.

* :mod:`agentrl_core.http.server`: a small ASGI app (routes, JSON bodies, one-sentence
  errors) and the uvicorn runner with its socket and process tuning;
* :mod:`agentrl_core.http.client`: a pooled HTTP/1.1 client for controller <-> worker traffic;
* :mod:`agentrl_core.http.auth`: the run's bearer token (``AGENTRL_TOKEN``): generating,
  resolving and checking it, and the refusal to serve a non-loopback address without one.

Nothing here knows about environments, engines or training.
"""
