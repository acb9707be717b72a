#!/usr/bin/env bash
# Installs the pinned versitygw (an S3 gateway used by the end-to-end tests)
# into bin/tools/versitygw, built from the Go module proxy. Idempotent: does
# nothing when the binary there already reports the pinned module version.
#
# Usage: scripts/install-versitygw.sh   (from anywhere inside the repository)
set -euo pipefail

VERSITYGW_MODULE=github.com/versity/versitygw
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bindir="$root/bin/tools"
bin="$bindir/versitygw"
go=${GO:-go}

installed_version() {
	# `go version -m` prints the module line: "mod <path> <version> <sum>".
	"$go" version -m "$1" 2>/dev/null | awk -v m="$VERSITYGW_MODULE" '$1 == "mod" && $2 == m { print $3 }'
}

if [ -x "$bin" ] && [ "$(installed_version "$bin")" = "$VERSITYGW_VERSION" ]; then
	echo "versitygw $VERSITYGW_VERSION already installed at bin/tools/versitygw"
	exit 0
fi

mkdir -p "$bindir"
echo "installing versitygw $VERSITYGW_VERSION into bin/tools (go install from the module proxy)..."
# Outside the walden module so that its go.mod is neither read nor changed.
cd "$bindir"
GOBIN="$bindir" "$go" install "$VERSITYGW_MODULE/cmd/versitygw@$VERSITYGW_VERSION"
got=$(installed_version "$bin")
if [ "$got" != "$VERSITYGW_VERSION" ]; then
	echo "install-versitygw: bin/tools/versitygw reports version '${got}', want $VERSITYGW_VERSION" >&2
	exit 1
fi
echo "versitygw $VERSITYGW_VERSION installed at bin/tools/versitygw"
