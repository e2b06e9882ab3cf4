#!/usr/bin/env python3
"""benches/s3_raw.py -- raw S3 throughput with boto3, the ceiling for benches/cold.sh.

    s3_raw.py mkbucket
    s3_raw.py put    [--prefix raw/] [--size-mib 1024] [--object-mib 16] [--threads 8]
    s3_raw.py get    [--prefix raw/] [--threads 8]
    s3_raw.py delete [--prefix raw/] [--threads 8]
    s3_raw.py upload FILE KEY [--threads 8] [--part-mib 16]
    s3_raw.py du     [--prefix raw/]

put writes SIZE_MIB in OBJECT_MIB objects (random bytes, generated before the clock starts)
from THREADS threads; get reads every object under PREFIX back from THREADS threads (bodies
read to the end and dropped). Each prints one JSON line on stdout:
    {"op", "bytes", "objects", "threads", "seconds", "mib_s"}
upload stores one file as one object (multipart, like `aws s3 cp`), for the FUSE peers.
du prints {"op": "du", "prefix", "objects", "bytes"} of what is stored under PREFIX.

Environment: S3_ENDPOINT (e.g. http://127.0.0.1:9100), S3_BUCKET, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION (default us-east-1). Path-style addressing; no optional
checksums (boto3 >= 1.36 adds a CRC32 to every PUT by default; tierfs' client does not).
Needs boto3 (the moto venv has it: /var/lib/tierfs-test-tools/moto-venv/bin/python).
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

try:
    import boto3
    from boto3.exceptions import S3UploadFailedError
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError:
    sys.exit("s3_raw.py: boto3 missing; run it with a python that has it, e.g. "
             "/var/lib/tierfs-test-tools/moto-venv/bin/python")

MIB = 1 << 20


def env(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        sys.exit(f"s3_raw.py: ${name} is not set")
    return value


def client(threads):
    cfg = {
        "s3": {"addressing_style": "path"},
        "max_pool_connections": max(10, threads * 2),
        "retries": {"max_attempts": 3, "mode": "standard"},
        "connect_timeout": 10,
        "read_timeout": 120,
    }
    try:
        config = Config(**cfg, request_checksum_calculation="when_required",
                        response_checksum_validation="when_required")
    except TypeError:  # botocore < 1.36 knows neither option (and adds no checksums)
        config = Config(**cfg)
    return boto3.client("s3", endpoint_url=env("S3_ENDPOINT"),
                        region_name=os.environ.get("AWS_REGION", "us-east-1"),
                        aws_access_key_id=env("AWS_ACCESS_KEY_ID"),
                        aws_secret_access_key=env("AWS_SECRET_ACCESS_KEY"), config=config)


def list_keys(s3, bucket, prefix):
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    return keys


def report(op, nbytes, objects, threads, seconds, **extra):
    out = {"op": op, "bytes": nbytes, "objects": objects, "threads": threads,
           "seconds": round(seconds, 4), "mib_s": round(nbytes / MIB / seconds, 2) if seconds > 0 else None}
    out.update(extra)
    print(json.dumps(out), flush=True)


def cmd_mkbucket(a):
    s3 = client(1)
    try:
        s3.create_bucket(Bucket=a.bucket)
    except ClientError as e:
        if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def cmd_put(a):
    s3 = client(a.threads)
    total = a.size_mib * MIB
    sizes = [a.object_mib * MIB] * (total // (a.object_mib * MIB))
    if total % (a.object_mib * MIB):
        sizes.append(total % (a.object_mib * MIB))
    bodies = [os.urandom(n) for n in sizes]  # before the clock: generation is not the S3's time
    keys = [f"{a.prefix}obj-{i:05d}" for i in range(len(bodies))]

    def put(i):
        s3.put_object(Bucket=a.bucket, Key=keys[i], Body=bodies[i])
        return len(bodies[i])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        done = sum(pool.map(put, range(len(bodies))))
    report("put", done, len(bodies), a.threads, time.perf_counter() - t0, object_bytes=a.object_mib * MIB)


def cmd_get(a):
    s3 = client(a.threads)
    keys = list_keys(s3, a.bucket, a.prefix)
    if not keys:
        sys.exit(f"s3_raw.py get: no objects under s3://{a.bucket}/{a.prefix}")

    def get(item):
        key, size = item
        body = s3.get_object(Bucket=a.bucket, Key=key)["Body"]
        n = 0
        while True:
            chunk = body.read(4 * MIB)
            if not chunk:
                break
            n += len(chunk)
        if n != size:
            raise RuntimeError(f"{key}: got {n} bytes, listed {size}")
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        done = sum(pool.map(get, keys))
    report("get", done, len(keys), a.threads, time.perf_counter() - t0)


def cmd_delete(a):
    s3 = client(a.threads)
    keys = [k for k, _ in list_keys(s3, a.bucket, a.prefix)]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=a.bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
    print(json.dumps({"op": "delete", "objects": len(keys)}), flush=True)


def cmd_du(a):
    keys = list_keys(client(1), a.bucket, a.prefix)
    print(json.dumps({"op": "du", "prefix": a.prefix, "objects": len(keys), "bytes": sum(n for _, n in keys)}))


def cmd_upload(a):
    s3 = client(a.threads)
    size = os.path.getsize(a.file)
    cfg = TransferConfig(multipart_threshold=a.part_mib * MIB, multipart_chunksize=a.part_mib * MIB,
                         max_concurrency=a.threads, use_threads=True)
    t0 = time.perf_counter()
    s3.upload_file(a.file, a.bucket, a.key, Config=cfg)
    head = s3.head_object(Bucket=a.bucket, Key=a.key)
    if head["ContentLength"] != size:
        sys.exit(f"s3_raw.py upload: {a.key} has {head['ContentLength']} bytes, file has {size}")
    report("upload", size, 1, a.threads, time.perf_counter() - t0, key=a.key)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bucket", default=os.environ.get("S3_BUCKET"))
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("mkbucket")
    for name in ("put", "get", "delete", "du"):
        s = sub.add_parser(name)
        s.add_argument("--prefix", default="raw/")
        s.add_argument("--threads", type=int, default=8)
        if name == "put":
            s.add_argument("--size-mib", type=int, default=int(os.environ.get("SIZE_MIB", 1024)))
            s.add_argument("--object-mib", type=int, default=16)
    s = sub.add_parser("upload")
    s.add_argument("file")
    s.add_argument("key")
    s.add_argument("--threads", type=int, default=8)
    s.add_argument("--part-mib", type=int, default=16)
    a = p.parse_args()
    if not a.bucket:
        sys.exit("s3_raw.py: no bucket (--bucket or $S3_BUCKET)")
    try:
        {"mkbucket": cmd_mkbucket, "put": cmd_put, "get": cmd_get, "delete": cmd_delete,
         "upload": cmd_upload, "du": cmd_du}[a.cmd](a)
    except (ClientError, S3UploadFailedError) as e:
        sys.exit(f"s3_raw.py {a.cmd} (endpoint {os.environ.get('S3_ENDPOINT')}, bucket {a.bucket}): {e}")


if __name__ == "__main__":
    main()
