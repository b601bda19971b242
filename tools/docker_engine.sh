#!/usr/bin/env bash
# A Docker engine for the compose tests (tests/test_compose_real.py), and the stand-in for the plant's base image.
#   sudo tools/docker_engine.sh          # install (once), start dockerd, build the base (once); idempotent
#   sudo tools/docker_engine.sh stop     # stop the dockerd this script started (its data stays for the next start)
# Debian's docker.io (20.10), docker-compose (1.29, Compose v1) and debootstrap. dockerd runs on its unix socket
# (no TCP port) with its data and log under $EDGEINSPECT_DOCKER_ROOT; overlay2 first, vfs where it cannot mount.
# No registry is reachable here, so `FROM python:3.11-slim` cannot be pulled: the base is Debian bookworm
# (python3 is 3.11) from debootstrap, imported as $EDGEINSPECT_BASE_IMAGE and passed as the PYTHON_IMAGE build arg.
set -euo pipefail
ROOT=${EDGEINSPECT_DOCKER_ROOT:-/var/lib/edgeinspect-docker}
BASE=${EDGEINSPECT_BASE_IMAGE:-edgeinspect/base-bookworm:local}
SOCK=/var/run/docker.sock
DOCKER=/usr/bin/docker  # Debian's client, the engine's own version
[ "$(id -u)" = 0 ] || { echo "tools/docker_engine.sh: run as root (dockerd and debootstrap need it)" >&2; exit 1; }

ready() { timeout 10 "$DOCKER" info >/dev/null 2>&1; }

if [ "${1:-}" = stop ]; then
  pid=$(cat "$ROOT/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    rm -f "$ROOT/dockerd.pid"
    echo "dockerd stopped"
  fi
  exit 0
fi

need=""
command -v dockerd >/dev/null || need="$need docker.io"
command -v docker-compose >/dev/null || need="$need docker-compose"
command -v debootstrap >/dev/null || need="$need debootstrap"
if [ -n "$need" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

mkdir -p "$ROOT"
if ! ready; then
  for driver in overlay2 vfs; do
    dockerd --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$ROOT/dockerd.pid" \
      --host "unix://$SOCK" --storage-driver "$driver" >>"$ROOT/dockerd.log" 2>&1 &
    for _ in $(seq 60); do ready && break; kill -0 $! 2>/dev/null || break; sleep 1; done
    if ready; then echo "dockerd up (storage driver $driver, data $ROOT/data, log $ROOT/dockerd.log)"; break; fi
    kill $! 2>/dev/null || true; wait $! 2>/dev/null || true
    echo "dockerd with $driver did not start (see $ROOT/dockerd.log)" >&2
  done
  ready || { tail -20 "$ROOT/dockerd.log" >&2; exit 1; }
fi

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  rootfs="$ROOT/rootfs-bookworm"
  rm -rf "$rootfs"
  # python3-venv for the image's venv; ca-certificates for TLS to peers (the image never reaches an index).
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
    >"$ROOT/debootstrap.log" 2>&1 || { tail -20 "$ROOT/debootstrap.log" >&2; exit 1; }
  # `python` as python:3.11-slim has it, so the Dockerfile reads the same on both bases.
  ln -sf python3 "$rootfs/usr/bin/python"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$DOCKER" import - "$BASE" >/dev/null
  rm -rf "$rootfs"
  echo "base image $BASE imported"
fi
echo "engine ready: DOCKER_HOST=unix://$SOCK, base $BASE"
