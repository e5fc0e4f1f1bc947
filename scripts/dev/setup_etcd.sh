#!/usr/bin/env bash
# Finds (or installs, from Debian's etcd-server package) the etcd binary the elastic
# tests start their 3-member clusters with, and openssl for the TLS test. Prints
# etcd's path.
set -euo pipefail
if [ -n "${TOPORUN_ETCD:-}" ] && [ -x "$TOPORUN_ETCD" ]; then
  echo "$TOPORUN_ETCD"; exit 0
fi
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-etcd: installing Debian's etcd-server" >&2
    # The package enables a system service; tests start their own members instead.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2 \
      || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2; }
  else
    echo "setup-etcd: no etcd on PATH; install etcd 3.4 or later (Debian: apt-get install etcd-server) or set TOPORUN_ETCD" >&2
    exit 1
  fi
fi
# The etcd TLS test makes its certificates with openssl.
if ! command -v openssl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2
  else
    echo "setup-etcd: the TLS test needs openssl; install it" >&2
    exit 1
  fi
fi
command -v etcd
