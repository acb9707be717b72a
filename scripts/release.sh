#!/usr/bin/env bash
# Builds the release VERSION of walden: for each platform a tarball
# walden-VERSION-OS-ARCH.tar.gz holding both binaries (walden, waldenctl:
# static, -trimpath, the version and commit stamped as the Makefile's
# LDFLAGS do), LICENSE, README.md and RELEASE-NOTES.md (the CHANGELOG's
# section of VERSION); beside them SHA256SUMS (sha256sum -c reads it) and
# RELEASE-NOTES.md. It refuses a VERSION that is not semver (vMAJOR.MINOR.PATCH,
# optionally -PRERELEASE) and one the CHANGELOG has no section for, before
# building anything.
#
# Usage: scripts/release.sh VERSION [OUT]        (make release VERSION=v0.1.0)
#   OUT        output directory (default dist/VERSION)
#   PLATFORMS  "os/arch ..." (default: linux/amd64 linux/arm64; walden runs on Linux only: its WAL
#              uses fallocate, fdatasync and madvise)
#   CHANGELOG  the changelog to take the notes from (default CHANGELOG.md)
#   COMMIT     the commit to stamp (default: git rev-parse HEAD, -dirty when the tree has changes)
set -euo pipefail

version=${1:?usage: scripts/release.sh VERSION [OUT]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${2:-$root/dist/$version}
platforms=${PLATFORMS:-linux/amd64 linux/arm64}
changelog=${CHANGELOG:-$root/CHANGELOG.md}
go=${GO:-go}

semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
if ! [[ $version =~ $semver ]]; then
	echo "release: $version is not a semantic version (vMAJOR.MINOR.PATCH, e.g. v0.1.0 or v0.2.0-rc.1)" >&2
	exit 2
fi
# The section "## [0.1.0] - 2026-12-02" up to the next "## [".
notes=$(awk -v v="${version#v}" '
	/^## \[/ { if (found) exit; if (index($0, "## [" v "]") == 1) { found = 1 } }
	found { print }' "$changelog")
if [ -z "$notes" ]; then
	echo "release: $changelog has no section \"## [${version#v}] - DATE\": move the Unreleased entries under it first (docs/runbook.md#releasing)" >&2
	exit 2
fi
commit=${COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo -dirty)}
ldflags="-X walden/version.version=$version -X walden/version.commit=$commit"

mkdir -p "$out"
out=$(cd "$out" && pwd)
printf '%s\n' "$notes" > "$out/RELEASE-NOTES.md"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for p in $platforms; do
	os=${p%/*} arch=${p#*/}
	name="walden-$version-$os-$arch"
	dir="$stage/$name"
	mkdir -p "$dir"
	echo "release: building $name"
	for cmd in walden waldenctl; do
		(cd "$root" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$go" build -trimpath -ldflags "$ldflags" -o "$dir/$cmd" "./cmd/$cmd")
	done
	cp "$root/LICENSE" "$root/README.md" "$dir/"
	cp "$out/RELEASE-NOTES.md" "$dir/"
	# Reproducible archives: fixed owner, order and times.
	tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00:00Z' -czf "$out/$name.tar.gz" "$name"
done
(cd "$out" && sha256sum ./*.tar.gz | sed 's| \./| |' > SHA256SUMS)
echo "release: $version ($commit) in $out:"
(cd "$out" && ls -1)
