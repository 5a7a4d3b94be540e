"""A TCP echo server for tests to run *inside* a sandbox (its own loopback).

Usage: python3 -c "$(cat sandbox-echo.py)" [PORT]

Binds 127.0.0.1:PORT (0, the default, picks a free port), prints
"listening PORT" on stdout once it accepts connections, and echoes every
connection back, passing a half-close on, until it is killed (the exec that
runs it is cancelled or the sandbox goes).
"""

import socket
import sys
import threading


def pump(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)


def serve(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        threading.Thread(target=pump, args=(conn,), daemon=True).start()


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = socket.create_server(("127.0.0.1", port), backlog=128)
    print("listening", server.getsockname()[1], flush=True)
    serve(server)


main()
