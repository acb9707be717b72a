package deploy_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseScript runs `make release`'s script for one platform against
// a changelog with a section for the version: a tarball holding both
// binaries, stamped with the version, the license, the README and the
// changelog's section; SHA256SUMS that match; the notes beside them. A
// version that is not semver, or without a section, is refused before
// anything is built.
func TestReleaseScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte("# Changelog\n\n## [Unreleased]\n\n- next\n\n## [9.8.7] - 2026-12-02\n\n### Added\n\n- the thing\n\n## [9.8.6] - 2026-11-01\n\n- older\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(version, out string) (string, error) {
		cmd := exec.Command("../scripts/release.sh", version, out)
		cmd.Env = append(os.Environ(), "PLATFORMS=linux/amd64", "CHANGELOG="+changelog, "COMMIT=0123456789abcdef")
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	for version, want := range map[string]string{"1.0": "not a semantic version", "v9.8": "not a semantic version", "v9.9.9": `no section "## [9.9.9]`} {
		out := t.TempDir()
		if msg, err := run(version, out); err == nil || !strings.Contains(msg, want) {
			t.Errorf("release %s: %v %q, want %q", version, err, msg, want)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("release %s wrote %v", version, entries)
		}
	}

	out := t.TempDir()
	if msg, err := run("v9.8.7", out); err != nil {
		t.Fatalf("release: %v\n%s", err, msg)
	}
	notes, _ := os.ReadFile(filepath.Join(out, "RELEASE-NOTES.md"))
	if !strings.HasPrefix(string(notes), "## [9.8.7] - 2026-12-02") || !strings.Contains(string(notes), "the thing") || strings.Contains(string(notes), "older") || strings.Contains(string(notes), "next") {
		t.Fatalf("notes:\n%s", notes)
	}
	sums, err := os.Open(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	n := 0
	for sc := bufio.NewScanner(sums); sc.Scan(); n++ {
		sum, name, _ := strings.Cut(sc.Text(), "  ")
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: SHA256SUMS says %s", name, sum)
		}
		if name != "walden-v9.8.7-linux-amd64.tar.gz" {
			t.Errorf("unexpected archive %s", name)
		}
	}
	if n != 1 {
		t.Fatalf("SHA256SUMS lists %d archives", n)
	}
	x := t.TempDir()
	if b, err := exec.Command("tar", "-xzf", filepath.Join(out, "walden-v9.8.7-linux-amd64.tar.gz"), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	dir := filepath.Join(x, "walden-v9.8.7-linux-amd64")
	for _, f := range []string{"walden", "waldenctl", "LICENSE", "README.md", "RELEASE-NOTES.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the archive lacks %s: %v", f, err)
		}
	}
	for _, bin := range []string{"walden", "waldenctl"} {
		b, err := exec.Command(filepath.Join(dir, bin), "version", "-o", "json").Output()
		var v struct{ Version, Commit string }
		if err != nil || json.Unmarshal(b, &v) != nil || v.Version != "v9.8.7" || v.Commit != "0123456789abcdef" {
			t.Errorf("%s version: %v %s", bin, err, b)
		}
	}
}
