package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"walden/internal/docgen"
)

// TestCLIReferenceUpToDate: docs/waldenctl.md is generated from the
// commands (every command, flag, default, description and example) and the
// exit status table; a command or flag added, removed or reworded fails here
// until `make docs` writes the page again.
func TestCLIReferenceUpToDate(t *testing.T) {
	root, _ := newRootCmd(io.Discard, io.Discard)
	root.InitDefaultCompletionCmd()
	// The page gives the exit status as a table of its own (below).
	root.Long, _, _ = strings.Cut(root.Long, "\n\nExit status:")
	var intro strings.Builder
	intro.WriteString("## Exit codes\n\nThe exit status says what happened, for scripts (`cmd/waldenctl/errors.go` decides it, in one table):\n\n| status | meaning |\n|---|---|\n")
	for _, r := range exitTable {
		fmt.Fprintf(&intro, "| %d | %s |\n", r.Code, r.Meaning)
	}
	intro.WriteString("\nOn failure waldenctl prints one line, `waldenctl: <what went wrong>`, on stderr, and a suggestion on a second " +
		"line when it has one: a typo's likely meaning, or the command that tells whether a change that got no answer was " +
		"carried out. With `-o json` (or `yaml`) the error is one JSON object on stderr: `message`, `code` (gRPC), `reason` " +
		"(the refusal's reason, [refusals.md](refusals.md)), `exit_code`, and for an unanswered change " +
		"`may_have_been_carried_out` and the `hint`.\n")
	page := docgen.CLI(root, intro.String())
	if err := docgen.Sync("../../docs/waldenctl.md", func(string) (string, error) { return page, nil }); err != nil {
		t.Fatal(err)
	}
}
