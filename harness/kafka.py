"""The Kafka-protocol broker of the local topology: Tansu, with its log in S3 on a local S3 server.

With S3 storage Tansu keeps no state of its own, so SIGKILL + restart of the broker loses nothing it
acknowledged (records and committed offsets live in the bucket).  The S3 server is a node too, so a
fault can kill it:
- ``moto`` (moto_server, in memory; the default): honours S3 conditional writes, which Tansu uses to
  hand out offsets.  A kill of the storage server loses the whole log.
- ``s3rver`` (npm, disk-backed): the bucket survives a kill of the storage server, but s3rver ignores
  conditional writes, so two producers appending to one partition at once can get the same offset and
  one acknowledged batch is overwritten.  Only for single-producer runs that kill the storage.
- ``memory``: Tansu's in-memory engine, no storage node; a broker kill loses everything.

Limits of this Tansu build (RECIPES.md): no idempotent or transactional producers; ListOffsets "latest"
can be short; consumer-group joins take seconds; one broker only (a kill is an outage until restart)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from harness.node import NodeError, ProcessNode

BUCKET = "tansu"
S3RVER_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
MOTO_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


def _no_proxy_env() -> dict[str, str]:
    # a host proxy setting must never route loopback traffic elsewhere
    return {"NO_PROXY": "*", "no_proxy": "*"}


def storage_node(kind: str, binary: Path, host: str, port: int, run_dir: Path) -> ProcessNode:
    name = "s3"
    data_dir = run_dir / "data" / name
    log_path = run_dir / "logs" / f"{name}.log"
    if kind == "s3rver":
        argv = [binary, "-d", data_dir, "-a", host, "-p", port, "--configure-bucket", BUCKET,
                "--allow-mismatched-signatures", "--silent"]
        after_ready = None
    elif kind == "moto":
        argv = [binary, "-H", host, "-p", port]
        after_ready = _create_bucket  # in memory: the bucket is gone after every (re)start
    else:
        raise ValueError(f"unknown S3 server kind {kind!r}")
    return ProcessNode(name, "storage", host, port, argv, log_path=log_path, data_dir=data_dir,
                       env=_no_proxy_env(), ready_check=_s3_answers, after_ready=after_ready)


def _s3_answers(node: ProcessNode) -> bool:
    try:
        urllib.request.urlopen(f"http://{node.host}:{node.port}/", timeout=0.5).close()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403, 404...) means the server is serving
    except OSError:
        return False


def _create_bucket(node: ProcessNode) -> None:
    request = urllib.request.Request(f"http://{node.host}:{node.port}/{BUCKET}", method="PUT")
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError as error:
        if error.code != 409:  # already exists
            raise NodeError(f"{node.name}: creating bucket {BUCKET!r} failed: HTTP {error.code}") from error


class TansuNode(ProcessNode):
    def __init__(self, binary: Path, host: str, port: int, run_dir: Path, storage: ProcessNode | None,
                 storage_kind: str) -> None:
        url = f"tcp://{host}:{port}"
        env: dict[str, str] = {**_no_proxy_env(), "RUST_LOG": "warn"}
        if storage is not None:
            engine = f"s3://{BUCKET}/"
            env.update(S3RVER_KEYS if storage_kind == "s3rver" else MOTO_KEYS)
            env.update({"AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": f"http://{storage.address}",
                        "AWS_ALLOW_HTTP": "true"})
        else:
            engine = f"memory://{BUCKET}/"
        argv = [binary, "broker", "--cluster-id", "ordeal", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", engine]
        super().__init__("kafka", "kafka", host, port, argv, log_path=run_dir / "logs" / "kafka.log",
                         data_dir=run_dir / "data" / "kafka", env=env)
        self.storage_engine = engine

    @property
    def bootstrap(self) -> str:
        return self.address


async def create_topics_async(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    """Create topics {name: partitions}; existing topics are left as they are."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    for name, partitions in topics.items():
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ValueError(f"topic {name!r}: partitions = {partitions!r}, expected an integer >= 1")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [NewTopic(name, partitions, 1) for name, partitions in topics.items() if name not in existing]
        if wanted:
            response = await admin.create_topics(wanted)
            for name, code, *_ in getattr(response, "topic_errors", getattr(response, "topics", [])):
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise NodeError(f"kafka: creating topic {name!r} failed with error code {code}")
    finally:
        await admin.close()


def create_topics(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    asyncio.run(create_topics_async(bootstrap, topics, timeout_s))
