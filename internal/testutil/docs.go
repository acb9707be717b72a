package testutil

import (
	"os"
	"strings"
	"testing"
)

// GeneratedSection checks that the part of the Markdown file at path
// between the markers
//
//	<!-- NAME: generated from package PKG (WALDEN_UPDATE_DOCS=1 go test ./PKG) -->
//	<!-- end of NAME -->
//
// is want, so that a reference table cannot drift from the code it is
// generated from. With WALDEN_UPDATE_DOCS=1 in the environment it rewrites
// that part instead.
func GeneratedSection(t testing.TB, path, name, pkg, want string) {
	t.Helper()
	begin := "<!-- " + name + ": generated from package " + pkg + " (WALDEN_UPDATE_DOCS=1 go test ./" + pkg + ") -->\n"
	end := "<!-- end of " + name + " -->\n"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated %s (markers %q ... %q)", path, name, begin, end)
	}
	got := doc[i+len(begin) : j]
	if got == want {
		return
	}
	if os.Getenv("WALDEN_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("the %s of %s is out of date: run WALDEN_UPDATE_DOCS=1 go test ./%s\ngot:\n%s\nwant:\n%s", name, path, pkg, got, want)
}
