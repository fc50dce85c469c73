#!/usr/bin/env python3
"""Test double of the cloudflared binary, as flask-cloudflared drives it.

It follows the real command-line interface for the calls flask-cloudflared makes:
  cloudflared update                                   -> exit 0 (nothing to update)
  cloudflared version                                  -> prints a version, exit 0
  cloudflared tunnel --metrics HOST:PORT --url URL     -> a quick tunnel
  cloudflared tunnel run TUNNEL_ID --metrics HOST:PORT -> a named tunnel
and serves the Prometheus metrics endpoint that flask-cloudflared polls for the tunnel's
hostname (`cloudflared_tunnel_user_hostnames_counts{userHostname="https://...trycloudflare.com"}`)
and for connections (`cloudflared_tunnel_ha_connections`). It does not reach the internet.
Each invocation's arguments are appended, as JSON, to the file named by CLOUDFLARED_DOUBLE_LOG.
"""

import http.server
import json
import os
import sys

HOSTNAME = "https://quiet-double-tunnel.trycloudflare.com"


def log_args(argv):
    path = os.environ.get("CLOUDFLARED_DOUBLE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(argv) + "\n")


def main(argv):
    log_args(argv)
    if argv[:1] == ["update"]:
        return 0
    if argv[:1] == ["version"]:
        print("cloudflared version 2026.1.0 (test double)")
        return 0
    if argv[:1] != ["tunnel"] or "--metrics" not in argv:
        print(f"unsupported arguments: {argv}", file=sys.stderr)
        return 2
    host, port = argv[argv.index("--metrics") + 1].rsplit(":", 1)
    named = "run" in argv

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            lines = ["# TYPE cloudflared_tunnel_ha_connections gauge", "cloudflared_tunnel_ha_connections 4"]
            if not named:
                lines.append(f'cloudflared_tunnel_user_hostnames_counts{{userHostname="{HOSTNAME}"}} 1')
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer((host, int(port)), Metrics).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
