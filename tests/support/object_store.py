"""An S3-protocol server for the tests: moto's server mode as a separate process on a free loopback
port (nothing imports moto in-process), and a TCP gate in front of it that a test closes and opens
again to make the object store go away and come back with its contents.

Only the tests know moto; Sluice sees an S3 endpoint URL like any other.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from pathlib import Path

from tests.support.servers import ManagedProcess, free_port, wait_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sluice-test-key",
    "AWS_SECRET_ACCESS_KEY": "sluice-test-secret",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask a metadata service off loopback
}


class MotoServer(ManagedProcess):
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            log=workdir / "moto.log",
            env={**os.environ, **CREDENTIALS},
        )

    def start(self) -> None:
        super().start()
        wait_port(self.port, 60)


def s3_client(endpoint_url: str):
    """A boto3 client of the test's own (to make buckets and look at what Sluice stored)."""
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def new_bucket(endpoint_url: str) -> str:
    name = f"sluice-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint_url).create_bucket(Bucket=name)
    return name


def objects(endpoint_url: str, bucket: str, prefix: str = "") -> dict[str, int]:
    """Every object under ``prefix``: key -> size."""
    client = s3_client(endpoint_url)
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            out[item["Key"]] = item["Size"]
    return out


class TcpGate:
    """A loopback TCP forwarder: ``close()`` refuses new connections and cuts open ones (the
    store is down), ``open()`` listens on the same port again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
            except OSError:
                pass
            listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
