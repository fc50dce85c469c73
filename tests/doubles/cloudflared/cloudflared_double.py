#!/usr/bin/env python3
"""Test double of the cloudflared binary, as flask-cloudflared drives it.

It accepts exactly the calls flask-cloudflared makes, and refuses anything else the way the
real command line does (an unknown flag is "Incorrect Usage", exit status 1):
  cloudflared update                                    -> exit 0 (nothing to update)
  cloudflared version                                   -> prints a version, exit 0
  cloudflared tunnel --metrics HOST:PORT --url URL      -> a quick tunnel
  cloudflared tunnel run TUNNEL_ID --metrics HOST:PORT  -> a named tunnel
It serves the Prometheus metrics endpoint that flask-cloudflared polls for the tunnel's
hostname (`cloudflared_tunnel_user_hostnames_counts{userHostname="https://...trycloudflare.com"}`)
and for connections (`cloudflared_tunnel_ha_connections`). It does not reach the internet.

Environment:
  CLOUDFLARED_DOUBLE_LOG      each invocation's arguments are appended to this file, as JSON
  CLOUDFLARED_DOUBLE_PENDING  the first N quick tunnels (counted in the log) never register with
                              the edge: their metrics come up without a hostname, as the real
                              binary's do until a connection is registered
"""

import http.server
import json
import os
import re
import sys

HOSTNAME = "https://quiet-double-tunnel.trycloudflare.com"
TUNNEL_FLAGS = ("metrics", "url", "config")
ADDRESS = re.compile(r"^[\w.\-]+:\d{1,5}$")
ORIGIN = re.compile(r"^https?://[\w.\-]+:\d{1,5}$")


class Usage(Exception):
    pass


def log_args(argv):
    path = os.environ.get("CLOUDFLARED_DOUBLE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(argv) + "\n")


def quick_tunnels_so_far():
    path = os.environ.get("CLOUDFLARED_DOUBLE_LOG")
    if not path or not os.path.exists(path):
        return 1
    with open(path) as f:
        calls = [json.loads(line) for line in f if line.strip()]
    return sum(1 for c in calls if c[:1] == ["tunnel"] and "run" not in c)


def parse_tunnel(args):
    """Flags (each with one value, as --name value) and positional words of `cloudflared tunnel`."""
    flags, words = {}, []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            name = arg.lstrip("-")
            if name not in TUNNEL_FLAGS:
                raise Usage(f"flag provided but not defined: -{name}")
            if i + 1 >= len(args):
                raise Usage(f"flag needs an argument: -{name}")
            if name in flags:
                raise Usage(f"flag given twice: -{name}")
            flags[name] = args[i + 1]
            i += 2
        else:
            words.append(arg)
            i += 1
    return flags, words


def check_tunnel(flags, words):
    """Only the two shapes flask-cloudflared uses; returns the tunnel id (None: a quick tunnel)."""
    if "config" in flags:
        raise Usage("this double does not read configuration files")
    if "metrics" not in flags or not ADDRESS.match(flags["metrics"]):
        raise Usage("--metrics HOST:PORT is required (flask-cloudflared always passes it)")
    if words == []:
        if "url" not in flags or not ORIGIN.match(flags["url"]):
            raise Usage("a quick tunnel needs --url http://HOST:PORT")
        return None
    if len(words) == 2 and words[0] == "run":
        if "url" in flags:
            raise Usage("flask-cloudflared passes no --url to a named tunnel")
        return words[1]
    raise Usage(f"unexpected arguments: {' '.join(words)}")


def serve_metrics(address, hostname):
    host, port = address.rsplit(":", 1)

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            lines = ["# TYPE cloudflared_tunnel_ha_connections gauge",
                     f"cloudflared_tunnel_ha_connections {4 if hostname is not False else 0}"]
            if hostname:
                lines.append(f'cloudflared_tunnel_user_hostnames_counts{{userHostname="{hostname}"}} 1')
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer((host, int(port)), Metrics).serve_forever()


def main(argv):
    log_args(argv)
    if argv in (["update"], ["version"]):
        if argv == ["version"]:
            print("cloudflared version 2026.1.0 (test double)")
        return 0
    if argv[:1] != ["tunnel"]:
        print(f"Incorrect Usage: unsupported command: {argv}", file=sys.stderr)
        return 1
    try:
        flags, words = parse_tunnel(argv[1:])
        tunnel_id = check_tunnel(flags, words)
    except Usage as e:
        print(f"Incorrect Usage: {e}", file=sys.stderr)
        return 1
    if tunnel_id is not None:
        hostname = None          # a named tunnel's hostname is not in the metrics
    elif quick_tunnels_so_far() <= int(os.environ.get("CLOUDFLARED_DOUBLE_PENDING", "0")):
        hostname = False         # never registered: no hostname, no connections
    else:
        hostname = HOSTNAME
    serve_metrics(flags["metrics"], hostname)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
