#!/usr/bin/env bash
# Installs the system packages that walden's tests need beyond Go modules,
# with apt-get (Debian and Ubuntu). It is the project's only installer of
# system packages: add a package to PACKAGES below with the reason, never a
# second script. Idempotent: packages already installed are skipped, and
# nothing is fetched when all are present. Runs as root without sudo, or
# through sudo when it is there.
#
#   chromium  headless browser of the web view's end-to-end test (webui
#             is driven through the Chrome DevTools protocol by chromedp)
#   libnss3-tools  pk12util and certutil: the browser test imports the
#             PKCS#12 bundle of `walden certs issue --p12` into the NSS
#             store Chromium reads, as a person does through the browser
#   iproute2  ip: the chaos harness's network namespaces, veths and bridge
#   nftables  nft: the chaos harness's link cuts in the bridge
#   iptables  iptables -j NFQUEUE: the chaos harness's loss and jitter
#   prometheus  promtool: make test-alerts runs the unit tests of the
#             shipped alert rules (deploy/prometheus/alerts_test.yml)
#
# Usage: scripts/install-deps.sh   (make deps calls it)
set -euo pipefail

PACKAGES=(chromium libnss3-tools iproute2 nftables iptables prometheus)

missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "system packages present: ${PACKAGES[*]}"
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "install-deps: no apt-get here; install these packages by hand: ${missing[*]}" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "install-deps: not root and no sudo; install these packages as root: ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi
echo "installing system packages: ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
