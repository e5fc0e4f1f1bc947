"""A local HTTP server answering like one cloud's metadata service, from the recorded
answers in tests/fixtures/metadata. Prints its port, then serves until killed.
Usage: metadata_server.py aws|gcp|azure|slow|garbage FIXTURE_DIR
slow: answers like aws after 3 s; garbage: 200 with an HTML page to every request;
endless: 200 and a chunked body that never ends. aws also serves the spot
interruption notice (spot/instance-action) once the file SPOT_NOTICE_FILE exists,
404 before, as EC2 does."""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

mode, fixtures = sys.argv[1], sys.argv[2]
rec = json.load(open(f"{fixtures}/{'aws' if mode in ('slow', 'garbage', 'endless') else mode}.json"))


class Handler(BaseHTTPRequestHandler):
    server_version = rec["server"]
    sys_version = ""

    def log_message(self, *args):
        pass

    def answer(self, code, body, headers=()):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def route(self, method):
        if mode == "slow":
            time.sleep(3)
        if mode == "endless":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"%x\r\n%s\r\n" % (65536, b"p" * 65536)
            try:
                while True:
                    self.wfile.write(chunk)
            except OSError:
                return
        if mode == "garbage":
            return self.answer(200, "<html><body>" + "\x07 not metadata " * 300 + "</body></html>")
        h = self.headers
        if mode in ("aws", "slow"):
            if method == "PUT" and self.path == "/latest/api/token":
                if not h.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.answer(400, "Missing TTL")
                return self.answer(200, rec["token"])
            if method == "GET" and self.path == "/latest/meta-data/instance-type":
                if h.get("X-aws-ec2-metadata-token") != rec["token"]:
                    return self.answer(401, "")
                return self.answer(200, rec["instance-type"])
            if method == "GET" and self.path == "/latest/meta-data/spot/instance-action":
                if h.get("X-aws-ec2-metadata-token") != rec["token"]:
                    return self.answer(401, "")
                if os.path.exists(os.environ.get("SPOT_NOTICE_FILE", "/nonexistent")):
                    return self.answer(200, json.dumps({"action": "terminate", "time": "2026-11-24T14:40:00Z"}))
        if mode == "gcp" and method == "GET" and self.path == "/computeMetadata/v1/instance/machine-type":
            if h.get("Metadata-Flavor") != "Google":
                return self.answer(403, "Missing Metadata-Flavor:Google header.")
            return self.answer(200, rec["machine-type"], [("Metadata-Flavor", "Google")])
        if mode == "azure" and method == "GET" and self.path.startswith("/metadata/instance/compute/vmSize?"):
            if h.get("Metadata") != "true":
                return self.answer(400, '{"error": "Bad request. Required metadata header not specified"}')
            return self.answer(200, rec["vmSize"])
        self.answer(404, "Not Found")

    def do_GET(self):
        self.route("GET")

    def do_PUT(self):
        self.route("PUT")


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
