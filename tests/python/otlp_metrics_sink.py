"""An OTLP/HTTP receiver for cairn's telemetry tests: decodes each
POST /v1/metrics and /v1/traces body with the official opentelemetry-proto
messages and appends one JSON line per metric data point or span to the
file given, then answers the empty Export*ServiceResponse. Prints its
port first.

Lines:
  {"metric": NAME, "attributes": {...}, "value": N}           sum, gauge
  {"metric": NAME, "attributes": {...}, "count": N, "sum": X}  histogram
  {"span": NAME, "attributes": {...}, "events": [{"name": ..., "attributes": {...}}],
   "trace_id": HEX, "status": CODE}

Usage: python otlp_metrics_sink.py OUT_FILE
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

OUT = sys.argv[1]
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(attrs):
    return {a.key: value(a.value) for a in attrs}


def metric_lines(body):
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    request.ParseFromString(body)
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    line = {"metric": metric.name, "attributes": attributes(point.attributes)}
                    if kind == "histogram":
                        line.update(count=point.count, sum=point.sum)
                    else:
                        line["value"] = getattr(point, point.WhichOneof("value"))
                    yield line
    reply = metrics_service_pb2.ExportMetricsServiceResponse()
    yield reply


def span_lines(body):
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield {
                    "span": span.name,
                    "attributes": attributes(span.attributes),
                    "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
                    "trace_id": span.trace_id.hex(),
                    "status": span.status.code,
                }
    yield trace_service_pb2.ExportTraceServiceResponse()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        decode = span_lines if self.path.endswith("/v1/traces") else metric_lines
        *lines, reply = list(decode(body))
        with LOCK, open(OUT, "a") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")
        reply = reply.SerializeToString()
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
