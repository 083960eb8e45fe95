"""The HTTP side: the client API, and the operator's view (Prometheus metrics, health
checks and the status page).

`create_web(parts, service_status)` (server.py) serves them all over `WebParts`
(parts.py), the parts the routes use; `create_api(parts)` (api.py) the client API alone.
"""
