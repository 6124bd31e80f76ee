"""The engine's metrics port: GET /metrics of a MetricsRegistry (engine.metrics) over
http.server, in its own thread.

Does not know: the series or their rendering (engine.metrics).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from inference_lab.engine.metrics.exposition import MetricsRegistry

# A connection of the metrics endpoint that sends nothing for this long is closed (a
# scrape takes milliseconds; each open connection holds a thread until then).
METRICS_SOCKET_TIMEOUT_S = 5.0


def serve_metrics(metrics: MetricsRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """GET /metrics in the classic text format, whatever the Accept header asks.

    prometheus-client's OpenMetrics output rewrites `vllm:` sample names to `vllm_`
    (client_python#1177), which would break every vLLM-compatible query. The text format
    keeps the colons. A connection idle for METRICS_SOCKET_TIMEOUT_S is closed, so idle
    connections cannot pile up threads.
    """

    class Handler(BaseHTTPRequestHandler):
        timeout = METRICS_SOCKET_TIMEOUT_S  # socket timeout of every read and write

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes are not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
