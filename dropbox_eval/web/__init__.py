"""The operator's view over HTTP: Prometheus metrics, health checks and the status page.

`create_web(app)` (in `server.py`) serves them beside the client API.
"""
