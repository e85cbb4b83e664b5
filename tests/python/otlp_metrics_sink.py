"""An OTLP/HTTP metrics receiver for cairn's telemetry test: decodes each
POST /v1/metrics body with the official opentelemetry-proto messages and
appends one line per data point's metric name to the file given, then
answers an empty ExportMetricsServiceResponse. Prints its port first.

Usage: python otlp_metrics_sink.py OUT_FILE
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

OUT = sys.argv[1]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(body)
        with open(OUT, "a") as out:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        out.write(metric.name + "\n")
        reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
