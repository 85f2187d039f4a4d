#!/usr/bin/env bash
# Sourced before a cargo build: the etcd client (HA coordinators) builds
# etcd's gRPC API with `protoc`, from Debian's protobuf-compiler package.
if ! command -v protoc >/dev/null && [ -z "${PROTOC:-}" ]; then
  if command -v apt-get >/dev/null; then
    { apt-get install -y -q protobuf-compiler || { apt-get update -q && apt-get install -y -q protobuf-compiler; }; } >/dev/null 2>&1
  fi
  command -v protoc >/dev/null ||
    { echo "protoc is needed to build (apt-get install protobuf-compiler, or set PROTOC)" >&2; exit 1; }
fi
