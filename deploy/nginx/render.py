#!/usr/bin/env python3
"""Render openshell-edge.conf.template into an nginx prefix directory.

    render.py --prefix DIR --listen 127.0.0.1:17670 \
        --replica gw-0=127.0.0.1:50061 --replica gw-1=127.0.0.1:50062

writes DIR/nginx.conf and DIR/tmp/, then prints the command that runs nginx
unprivileged from DIR. Python 3 standard library only.
"""

import argparse
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEMPLATE = os.path.join(HERE, "openshell-edge.conf.template")

# Replica ids are short stable names (gw-0, openshell-1, ...).
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# host:port, where host is an IPv4 address, a DNS name or a bracketed IPv6 address.
ADDR_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def fail(message):
    print(f"render.py: {message}", file=sys.stderr)
    sys.exit(2)


def parse_addr(value, what):
    """host:port (an http:// prefix and a trailing slash are accepted)."""
    text = value
    if text.startswith("http://"):
        text = text[len("http://"):]
    elif "://" in text:
        fail(f"{what}: only plain http (h2c) addresses are supported: {value!r}")
    text = text.rstrip("/")
    match = ADDR_RE.match(text)
    if not match or not 1 <= int(match.group(2)) <= 65535:
        fail(f"{what}: expected host:port, got {value!r}")
    return text


def parse_replica(value):
    if "=" not in value:
        fail(f"--replica: expected ID=HOST:PORT, got {value!r}")
    replica_id, addr = value.split("=", 1)
    if not ID_RE.match(replica_id):
        fail(f"--replica: invalid replica id {replica_id!r} (letters, digits, '.', '_', '-')")
    return replica_id, parse_addr(addr, f"--replica {replica_id}")


def render(template, listen, replicas, fail_timeout, user, max_streams):
    map_entries = []
    upstreams = []
    default_servers = []
    for index, (replica_id, addr) in enumerate(replicas):
        name = f"openshell_replica_{index}"
        # map compares plain strings case-insensitively; an anchored regex
        # (`~`, case-sensitive) matches the id exactly, as the built-in edge does.
        key = "~^" + replica_id.replace(".", "\\.") + "$"
        map_entries.append(f"        {key:<28} {name};")
        upstreams.append(
            f"    upstream {name} {{  # {replica_id}\n"
            f"        server {addr} max_fails=0;\n"
            f"        keepalive 16;\n"
            f"    }}"
        )
        default_servers.append(
            f"        server {addr} max_fails=1 fail_timeout={fail_timeout};  # {replica_id}"
        )
    values = {
        "LISTEN": listen,
        "MAP_ENTRIES": "\n".join(map_entries),
        "REPLICA_UPSTREAMS": "\n".join(upstreams),
        "DEFAULT_SERVERS": "\n".join(default_servers),
        "REPLICA_COUNT": str(len(replicas)),
        "MAX_STREAMS": str(max_streams),
    }
    text = template
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", value)
    if user:
        text = f"user {user};\n" + text
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--prefix", required=True, help="directory for nginx.conf, logs and temp files")
    parser.add_argument("--listen", default="127.0.0.1:17670", help="HOST:PORT the edge listens on")
    parser.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="ID=HOST:PORT",
        help="a replica (repeatable)",
    )
    parser.add_argument("--template", default=DEFAULT_TEMPLATE)
    parser.add_argument(
        "--fail-timeout",
        default="2s",
        help="how long the default upstream skips a replica whose connect failed (default 2s)",
    )
    parser.add_argument(
        "--max-concurrent-streams",
        type=int,
        default=1024,
        help="HTTP/2 streams one client connection may keep open (default 1024; nginx's own is 128)",
    )
    parser.add_argument(
        "--user",
        help="worker user (only used when nginx starts as root; nginx's default is nobody)",
    )
    args = parser.parse_args()

    listen = parse_addr(args.listen, "--listen")
    if not args.replica:
        fail("at least one --replica is required")
    replicas = [parse_replica(r) for r in args.replica]
    ids = [r[0] for r in replicas]
    if len(set(ids)) != len(ids):
        fail("replica ids must be unique")
    if not re.match(r"^[0-9]+[smh]?$", args.fail_timeout):
        fail(f"--fail-timeout: expected a number with an optional s/m/h unit, got {args.fail_timeout!r}")
    if not 1 <= args.max_concurrent_streams <= 1_000_000:
        fail("--max-concurrent-streams must be between 1 and 1000000")
    if args.user is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", args.user):
        fail(f"--user: invalid user name {args.user!r}")

    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    prefix = os.path.abspath(args.prefix)
    template = template.replace("@@PREFIX@@", prefix)
    text = render(
        template, listen, replicas, args.fail_timeout, args.user, args.max_concurrent_streams
    )
    leftover = re.findall(r"@@[A-Z_]+@@", text)
    if leftover:
        fail(f"template placeholders left unrendered: {sorted(set(leftover))}")

    os.makedirs(prefix, exist_ok=True)
    # Workers (nobody when the master runs as root) must reach the temp paths.
    os.chmod(prefix, 0o755)
    for name in TEMP_DIRS:
        os.makedirs(os.path.join(prefix, "tmp", name), exist_ok=True)
    os.chmod(os.path.join(prefix, "tmp"), 0o755)
    conf = os.path.join(prefix, "nginx.conf")
    tmp = conf + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, conf)

    q = shlex.quote
    print(
        f"nginx -p {q(prefix)} -c nginx.conf "
        f"-g {q(f'daemon off; pid {prefix}/nginx.pid;')} -e {q(prefix + '/error.log')}"
    )


if __name__ == "__main__":
    main()
