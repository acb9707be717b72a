package policy_test

import (
	"os"
	"strings"
	"testing"

	"walden/policy"
)

// Markers around the generated table in docs/detection.md.
const (
	tableBegin = "<!-- policy keys: generated from package policy (WALDEN_UPDATE_DOCS=1 go test ./policy) -->\n"
	tableEnd   = "<!-- end of policy keys -->\n"
)

// TestPolicyTableInDocs fails when the policy keys table of
// docs/detection.md differs from policy.MarkdownTable; with
// WALDEN_UPDATE_DOCS=1 it rewrites it.
func TestPolicyTableInDocs(t *testing.T) {
	const path = "../docs/detection.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, tableBegin)
	j := strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated policy table (markers %q ... %q)", path, tableBegin, tableEnd)
	}
	want := policy.MarkdownTable()
	got := doc[i+len(tableBegin) : j]
	if got == want {
		return
	}
	if os.Getenv("WALDEN_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(doc[:i+len(tableBegin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("the policy keys table of %s is out of date: run WALDEN_UPDATE_DOCS=1 go test ./policy -run TestPolicyTableInDocs\ngot:\n%s\nwant:\n%s", path, got, want)
}

func TestEveryKeyDocumented(t *testing.T) {
	for _, line := range strings.Split(strings.TrimSpace(policy.MarkdownTable()), "\n")[2:] {
		cells := strings.Split(line, "|")
		if len(cells) != 6 || strings.TrimSpace(cells[3]) == "" || strings.TrimSpace(cells[4]) == "" {
			t.Errorf("undocumented key: %s", line)
		}
	}
}
