#!/usr/bin/env bash
# Installs everything Ordeal needs on a fresh Debian 12 machine, idempotently:
# system packages through apt-get (when root), Node's s3rver, and the Python packages into ./.venv.
# Prints nothing but progress; safe to run again (it skips what is already there).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

need_apt=()
# rabbitmq-server: RabbitMQ's MQTT plugin, a shipped black-box target (scenarios/rabbitmq-*.toml).
# ejabberd: ejabberd's mod_mqtt, a clustered black-box target (scenarios/ejabberd-cluster-*.toml).
# faketime (and its libfaketime): the clock faults' preload into a node's processes (faults/clock.py).
# fuse3 + libfuse3-dev, pkg-config, gcc: pip builds pyfuse3 (no wheel here) for harness/lazyfs, the power-loss
# file system (faults/power.py).
for pair in redis-server:redis-server mosquitto:mosquitto nft:nftables ip:iproute2 unshare:util-linux java:openjdk-17-jre-headless node:nodejs npm:npm /usr/lib/rabbitmq/bin/rabbitmq-server:rabbitmq-server /usr/sbin/ejabberdctl:ejabberd faketime:faketime fusermount3:fuse3 pkg-config:pkg-config gcc:gcc /usr/include/fuse3/fuse.h:libfuse3-dev; do
  bin="${pair%%:*}"; pkg="${pair#*:}"
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || [ -f "$bin" ] || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # Debian starts daemons on install (RabbitMQ and ejabberd also an epmd); Ordeal runs its own: forbid that
    # for the install (policy-rc.d exit 101 = "action not allowed"; invoke-rc.d and deb-systemd-invoke both
    # ask it), unless the machine already has a policy.
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
    # Debian starts these as services on install; Ordeal runs its own, so stop the system ones.
    for svc in redis-server mosquitto rabbitmq-server ejabberd; do
      if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
      # Not ejabberd's init script: its stop runs `ejabberdctl stopped`, which may `epmd -kill` the host's epmd.
      if [ "$svc" != ejabberd ] && [ -x "/etc/init.d/$svc" ]; then "/etc/init.d/$svc" stop >/dev/null 2>&1 || true; fi
    done
  else
    echo "bootstrap: missing system packages: ${need_apt[*]} (not root: install them yourself; continuing)" >&2
  fi
fi

# Containers (the containers topology provider, harness/containers/): Podman from Debian with the runc
# runtime, and debootstrap for the Debian base image (docs/recipes.md "Containers").  Skipped with
# ORDEAL_CONTAINERS=0.  The settings this sandbox needs go into a drop-in file of their own, so an existing
# /etc/containers/containers.conf is left as it is.
if [ "${ORDEAL_CONTAINERS:-1}" != 0 ]; then
  need_ctr=()
  # catatonit: the init every server container runs as PID 1 (init=True, harness/containers/node.py); only a
  # Recommends of podman, so --no-install-recommends leaves it out and every container create fails.
  for pair in podman:podman runc:runc debootstrap:debootstrap nsenter:util-linux catatonit:catatonit; do
    bin="${pair%%:*}"; pkg="${pair#*:}"
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_ctr+=("$pkg")
  done
  if [ ${#need_ctr[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "bootstrap: apt-get install ${need_ctr[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends "${need_ctr[@]}" netavark aardvark-dns conmon \
        containernetworking-plugins uidmap >/dev/null
    else
      echo "bootstrap: missing container packages: ${need_ctr[*]} (not root: install them yourself; continuing)" >&2
    fi
  fi
  if [ "$(id -u)" = 0 ] && command -v podman >/dev/null 2>&1; then
    dropin=/etc/containers/containers.conf.d/50-ordeal.conf
    if [ ! -f "$dropin" ]; then
      mkdir -p /etc/containers/containers.conf.d
      cat >"$dropin" <<'CONF'
# Written by ordeal's scripts/bootstrap.sh (docs/recipes.md "Containers: Podman from Debian").
[containers]
# the default nofile/nproc limits exceed this sandbox's hard limits: setrlimit EPERM
default_ulimits = []
[engine]
# crun fails here: "cgroups in hybrid mode not supported"
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
      echo "bootstrap: wrote $dropin"
    fi
  fi
fi

# s3rver: a disk-backed S3 API, for scenarios that kill Tansu's storage server (kafka_storage = "s3rver";
# the default S3 API is moto, which honours the conditional writes Tansu needs with concurrent producers).
if [ ! -x .cache/node/node_modules/.bin/s3rver ] && command -v npm >/dev/null 2>&1; then
  echo "bootstrap: npm install s3rver"
  mkdir -p .cache/node
  (cd .cache/node && npm install --silent --no-audit --no-fund --prefix . s3rver@3 >/dev/null 2>&1) \
    || echo "bootstrap: s3rver could not be installed; scenarios with kafka_storage = \"s3rver\" will say what is missing" >&2
fi

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.ordeal-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: pip install -e .[dev] (first time: a few minutes, pyspark is large)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  if ! .venv/bin/python -m pip install -q -e ".[dev]" >.venv/pip-install.log 2>&1; then
    grep -vE "is ignored: it is neither" .venv/pip-install.log >&2
    echo "bootstrap: pip install failed (log: .venv/pip-install.log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
