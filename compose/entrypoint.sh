#!/bin/sh
# Container entrypoint: exports each secret mounted as /run/secrets/EDGEINSPECT_<NAME> as the environment variable
# of that name (the settings classes read EDGEINSPECT_* from the environment), then runs `edgeinspect ARGS`.
# Secrets therefore never sit in the image, in a rendered settings file or in `docker inspect` output.
set -eu
for secret in "${SECRETS_DIR:-/run/secrets}"/EDGEINSPECT_*; do
    [ -f "$secret" ] || continue
    name=$(basename "$secret")
    value=$(cat "$secret")
    export "$name=$value"
done
exec edgeinspect "$@"
