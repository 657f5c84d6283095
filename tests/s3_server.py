"""A real S3-API server for the object-storage adapter tests: moto's standalone server, run from
its own environment (scripts/s3_server.sh, lock requirements/moto-server.txt; `make setup`
installs it) as a process on a free port. The product reaches it over HTTP exactly as it
reaches AWS S3 or MinIO; the tests write to it with boto3's own client.
"""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "s3_server.sh"
START_TIMEOUT_S = 120  # the first call may install the environment (~40 s)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lora-test", "AWS_SECRET_ACCESS_KEY": "lora-test-secret"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """`start()`, `stop()` (the store goes away: connections refused), `start()` again on the
    same port (an empty store: moto keeps nothing), `pause()` / `resume()` (a store that
    accepts connections and never answers)."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def environment(self) -> dict[str, str]:
        """The standard AWS variables a client (ours included) finds this server by."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            **CREDENTIALS,
        }

    def start(self) -> "S3Server":
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open by the server process
        self.process = subprocess.Popen(
            [str(SCRIPT), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"moto_server not up after {START_TIMEOUT_S} s ({self.log_path})")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGCONT)  # a paused server must be able to exit
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def requests_for(self, key: str) -> list[str]:
        """The server's access-log lines that name `key` (what was downloaded, and how)."""
        return [line for line in self.log_path.read_text().splitlines() if key in line]


def upload(client, bucket: str, prefix: str, folder: Path, name: str | None = None) -> None:
    """Every file of `folder` as prefix/<name>/<file>."""
    for file in sorted(folder.iterdir()):
        if file.is_file():
            key = f"{prefix}{name or folder.name}/{file.name}"
            client.put_object(Bucket=bucket, Key=key, Body=file.read_bytes())


def delete(client, bucket: str, prefix: str) -> None:
    """Every object under prefix."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    for item in listed:
        client.delete_object(Bucket=bucket, Key=item["Key"])
