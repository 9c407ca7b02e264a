"""engine-serve's HTTP server: a client that resets an idle keep-alive connection leaves nothing in the
log, while a handler that fails still prints its traceback. Catches: one stdlib traceback per dropped
connection (every rollout's exit wrote ~20 of them), and a filter so wide it hides real errors."""

import contextlib
import io
import socket
import struct
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler

import common  # noqa: F401  (puts rstar_backend on the path)
from rstar_backend.engine import Server


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        if self.path == "/broken":
            raise ValueError("a real handler error")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class ServerLog(unittest.TestCase):
    def serve(self):
        server = Server(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return server.server_address[1]

    def get(self, port, path):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return s

    def stderr_of(self, act):
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            act()
            time.sleep(0.5)  # the handler thread reports after the client is gone
        return buf.getvalue()

    def test_a_reset_keep_alive_connection_is_not_an_error(self):
        port = self.serve()

        def reset_after_one_answer():
            s = self.get(port, "/")
            self.assertIn(b"200", s.recv(1024))
            # SO_LINGER 0: close() sends RST, as a client pool torn down at exit does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

        self.assertEqual(self.stderr_of(reset_after_one_answer), "")

    def test_a_failing_handler_is_still_reported(self):
        port = self.serve()

        def broken():
            s = self.get(port, "/broken")
            s.recv(1024)
            s.close()

        err = self.stderr_of(broken)
        self.assertIn("Traceback", err)
        self.assertIn("a real handler error", err)


if __name__ == "__main__":
    unittest.main()
