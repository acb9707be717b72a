package policy_test

import (
	"strings"
	"testing"

	"walden/internal/testutil"
	"walden/policy"
)

// TestPolicyTableInDocs fails when the policy keys table of
// docs/detection.md differs from policy.MarkdownTable; with
// WALDEN_UPDATE_DOCS=1 it rewrites it.
func TestPolicyTableInDocs(t *testing.T) {
	testutil.GeneratedSection(t, "../docs/detection.md", "policy keys", "policy", policy.MarkdownTable())
}

func TestEveryKeyDocumented(t *testing.T) {
	for _, line := range strings.Split(strings.TrimSpace(policy.MarkdownTable()), "\n")[2:] {
		cells := strings.Split(line, "|")
		if len(cells) != 6 || strings.TrimSpace(cells[3]) == "" || strings.TrimSpace(cells[4]) == "" {
			t.Errorf("undocumented key: %s", line)
		}
	}
}
