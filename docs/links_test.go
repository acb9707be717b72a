// Package docs holds walden's documentation pages; its test keeps them
// honest: every relative link and anchor resolves, and the README stays a
// page that fits on a few screens.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	linkRe    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	headingRe = regexp.MustCompile(`(?m)^#{1,6} (.*)$`)
	fenceRe   = regexp.MustCompile("(?s)```.*?```")
	slugDrop  = regexp.MustCompile(`[^a-z0-9 \-_]`)
)

// anchors returns the heading anchors of a markdown file, as a renderer
// makes them (lower case, punctuation dropped, spaces to hyphens).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range headingRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(string(b), ""), -1) {
		s := strings.ToLower(strings.TrimSpace(m[1]))
		s = slugDrop.ReplaceAllString(strings.ReplaceAll(s, "`", ""), "")
		out[strings.ReplaceAll(s, " ", "-")] = true
	}
	return out
}

func TestLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md")
	more, _ := filepath.Glob("../*/DESIGN.md")
	pages = append(pages, more...)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(string(b), ""), -1) {
			url := m[1]
			if strings.Contains(url, "://") || strings.HasPrefix(url, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(url, "#")
			target := page
			if path != "" {
				target = filepath.Join(filepath.Dir(page), path)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %s: %v", page, url, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(t, target)[anchor] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", page, url, target)
			}
		}
	}
}

func TestReadmeFits(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 250 {
		t.Fatalf("README.md has %d lines: keep it to 250 (what walden is, the flow, the two commands, where to go next); the rest belongs in docs/", n)
	}
}
