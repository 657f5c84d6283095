"""Adapter roots in object storage: `s3://bucket/prefix/` on any S3 API (AWS S3, MinIO, Ceph
RGW, GCS's S3 interoperability), through boto3.

Endpoint, region and credentials come from the standard AWS chain (AWS_ENDPOINT_URL or
AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE and
~/.aws/config, instance and pod roles), so model.json names only the bucket and prefix.

Each scan lists the prefix: every immediate "subfolder" is an adapter named after it, whose
version (the candidate's fingerprint) is its files' ETags. A new or changed version is
downloaded into the private snapshot (each object fetched with If-Match on the listed ETag,
so what is downloaded is exactly what was listed) and checked there like a folder's. Refused
with a reason, the rest going on: a key with a `..`, `.` or empty component (no key ever
names a path outside its adapter), pickled weights without safetensors, an adapter over
max_adapter_objects objects or whose files to download exceed max_adapter_bytes (known from
the listing, before anything is downloaded). A store that is down or slow makes the root
unreadable for that scan (its adapters keep serving) within bounded time: short connect and
read timeouts, one retry, and a deadline per listing and per download.
"""

import threading
import time
from pathlib import Path

from lora_serving.adapters.catalog import (
    CONFIG_FILE,
    PICKLE_FILE,
    PICKLE_REFUSED,
    WEIGHTS_FILE,
    check_adapter_name,
)
from lora_serving.adapters.sources import (
    CONTROL,
    ROOT,
    Candidate,
    Refusal,
    SourceScan,
    SourceUnavailable,
)
from lora_serving.errors import ConfigError, InvalidRequest

SCHEME = "s3://"
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
MAX_ATTEMPTS = 2  # one retry (botocore's "standard" mode)
LIST_DEADLINE_S = 30.0  # one listing of a root, every page
MAX_LISTED = 100_000  # objects under one root
DOWNLOAD_DEADLINE_S = 30.0  # per adapter, plus 1 s per MiB
_CHUNK = 1 << 20
_DOWNLOADED = (CONFIG_FILE, WEIGHTS_FILE)
_PICKLES = (PICKLE_FILE, ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def is_s3_url(root) -> bool:
    return isinstance(root, str) and root.startswith(SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """s3://bucket/prefix/ -> (bucket, "prefix/"); the prefix is "" or ends with "/"."""
    bucket, _, prefix = url.removeprefix(SCHEME).partition("/")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


def _unsafe(relative: str) -> bool:
    """A key (below the root) with a `..`, `.` or empty component; a trailing "/" (a folder
    marker, as consoles create) is fine."""
    parts = relative.removesuffix("/").split("/")
    return any(part in ("", ".", "..") for part in parts)


def s3_client():
    """A client from the standard AWS chain, bounded so a scan cannot hang."""
    import boto3  # only where a root is in object storage
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        user_agent_extra="lora-serving",
    )
    return boto3.session.Session().client("s3", config=config)


class S3Root:
    """An adapter root in object storage (see the module's docstring)."""

    def __init__(self, url: str, *, max_adapter_bytes: int, max_objects: int, client=None):
        self.url = url
        self.key = url
        self.bucket, self.prefix = split_url(url)
        self.max_adapter_bytes = max_adapter_bytes
        self.max_objects = max_objects
        self._client = client
        self._client_lock = threading.Lock()
        self._listed = False  # the last listing succeeded

    # ---- scanning --------------------------------------------------------------------------
    def scan(self) -> SourceScan:
        scan = SourceScan()
        try:
            objects = self._list(self.prefix)
        except SourceUnavailable as err:
            self._listed = False
            scan.unreadable[self.key] = f"adapter root {self.url} cannot be read: {err}"
            return scan
        self._listed = True
        groups: dict[str, list[dict]] = {}
        for item in objects:
            name = item["Key"][len(self.prefix) :].split("/", 1)[0]
            if "/" in item["Key"][len(self.prefix) :]:  # in a "subfolder", not beside them
                groups.setdefault(name, []).append(item)
        for name in sorted(groups):
            self._offer(scan, name, groups[name], ROOT)
        return scan

    def _offer(self, scan: SourceScan, name: str, objects: list[dict], source: str) -> None:
        unsafe = [item["Key"] for item in objects if _unsafe(item["Key"][len(self.prefix) :])]
        if name.startswith(".") and not unsafe:
            return  # hidden, like a dot-folder
        shown = name if name and name.isprintable() else repr(name or unsafe[0])
        where = f"{self.url}{shown}/"
        try:
            if unsafe:
                raise InvalidRequest(
                    f"key {unsafe[0]!r} has a '..', '.' or empty path component: refused"
                )
            check_adapter_name(name)
            candidate = self._candidate(name, objects, source, name)
        except (InvalidRequest, ConfigError) as err:
            scan.refused.setdefault(shown[:80], Refusal(source, f"{where}: {err}"))
            return
        scan.candidates[name] = candidate

    def _candidate(self, name: str, objects: list[dict], source: str, folder: str) -> Candidate:
        """The adapter made of `objects` (the keys under prefix + folder + "/")."""
        base = f"{self.prefix}{folder}/"
        files = {item["Key"][len(base) :]: item for item in objects}
        if len(objects) > self.max_objects:
            raise ConfigError(
                f"adapter '{name}'",
                [f"{len(objects)} objects, over max_adapter_objects {self.max_objects}"],
            )
        if WEIGHTS_FILE not in files:
            pickles = sorted(key for key in files if "/" not in key and key.endswith(_PICKLES))
            if pickles:
                detail = PICKLE_REFUSED.replace(PICKLE_FILE, ", ".join(pickles), 1)
                raise ConfigError(f"adapter '{name}'", [detail])
        size = sum(files[file]["Size"] for file in _DOWNLOADED if file in files)
        if size > self.max_adapter_bytes:
            raise ConfigError(
                f"adapter '{name}'",
                [f"{size} bytes to download, over max_adapter_bytes {self.max_adapter_bytes}"],
            )
        downloaded = tuple(
            (file, files[file]["Key"], files[file]["ETag"], files[file]["Size"])
            for file in _DOWNLOADED
            if file in files
        )
        origin = f"{SCHEME}{self.bucket}/{base}"
        return Candidate(name, origin, source, (origin, *downloaded), self.url, provider=self)

    def _list(self, prefix: str) -> list[dict]:
        """Every object under `prefix`, page by page, within LIST_DEADLINE_S."""
        client = self._connect()
        deadline = time.monotonic() + LIST_DEADLINE_S
        objects, token = [], None
        while True:
            arguments = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                arguments["ContinuationToken"] = token
            page = self._call(client.list_objects_v2, **arguments)
            objects.extend(page.get("Contents", ()))
            if len(objects) > MAX_LISTED:
                raise SourceUnavailable(f"more than {MAX_LISTED} objects under {self.url}")
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return objects
            if time.monotonic() > deadline:
                raise SourceUnavailable(f"listing took over {LIST_DEADLINE_S:.0f} s")

    # ---- downloading -----------------------------------------------------------------------
    def materialise(self, candidate: Candidate, folder: Path) -> None:
        client = self._connect()
        size = sum(item[3] for item in candidate.fingerprint[1:])
        deadline = time.monotonic() + DOWNLOAD_DEADLINE_S + size / _CHUNK
        for file, key, etag, listed_size in candidate.fingerprint[1:]:
            self._download(client, key, etag, listed_size, folder / file, deadline)

    def _download(self, client, key: str, etag: str, size: int, target: Path, deadline) -> None:
        reply = self._call(client.get_object, Bucket=self.bucket, Key=key, IfMatch=etag)
        body, written = reply["Body"], 0
        try:
            with open(target, "xb") as out:
                while chunk := self._read(body, key):
                    written += len(chunk)
                    if written > size:
                        raise SourceUnavailable(f"{key} is larger than listed ({size} bytes)")
                    if time.monotonic() > deadline:
                        raise SourceUnavailable(f"downloading {key} took too long")
                    out.write(chunk)
        finally:
            body.close()
        if written != size:
            raise SourceUnavailable(f"{key}: {written} of its {size} bytes arrived")

    @staticmethod
    def _read(body, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return body.read(_CHUNK)
        except (BotoCoreError, OSError) as err:
            raise SourceUnavailable(f"downloading {key}: {err}") from None

    # ---- control requests and listing ----------------------------------------------------------
    def join(self, relative: str) -> str:
        return f"{self.url}{relative.strip('/')}/"

    def locate(self, name: str, path: str) -> Candidate | None:
        """`load name s3://bucket/prefix/folder/`: a folder directly under this root."""
        if not path.startswith(self.url):
            return None
        folder = path[len(self.url) :].strip("/")
        if not folder or "/" in folder or _unsafe(folder):
            raise InvalidRequest(f"adapter {path}: name one folder directly under {self.url}")
        try:
            objects = self._list(f"{self.prefix}{folder}/")
        except SourceUnavailable as err:
            raise InvalidRequest(f"adapter root {self.url} cannot be read: {err}") from None
        if not objects:
            raise InvalidRequest(f"adapter {path} does not exist")
        unsafe = [item["Key"] for item in objects if _unsafe(item["Key"][len(self.prefix) :])]
        if unsafe:
            raise InvalidRequest(f"key {unsafe[0]!r} has a '..', '.' or empty path component")
        try:
            return self._candidate(name, objects, CONTROL, folder)
        except ConfigError as err:
            raise InvalidRequest(str(err)) from None

    def describe(self) -> dict:
        return {"path": self.url, "exists": self._listed}

    # ---- the client ----------------------------------------------------------------------------
    def _connect(self):
        with self._client_lock:
            if self._client is None:
                try:
                    self._client = s3_client()
                except Exception as err:  # botocore's configuration errors have many types
                    raise SourceUnavailable(f"no S3 client: {err}") from None
            return self._client

    def _call(self, operation, **arguments):
        """One S3 request; any failure is SourceUnavailable with the store's own reason."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return operation(**arguments)
        except ClientError as err:
            error = err.response.get("Error", {})
            code, message = error.get("Code", "?"), error.get("Message", "")
            if code in ("PreconditionFailed", "412"):
                message = "it changed since it was listed; taken at the next rescan"
            raise SourceUnavailable(f"{arguments.get('Key', self.url)}: {code} {message}") from None
        except BotoCoreError as err:
            raise SourceUnavailable(str(err)) from None
