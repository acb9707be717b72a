package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"walden/version"
)

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"version", "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("version -o json is not JSON: %v\n%s", err, out.String())
	}
	want := version.Get()
	if got["version"] != want.Version || got["commit"] != want.Commit || got["go_version"] != want.GoVersion || len(got) != 3 {
		t.Fatalf("version -o json = %v, want %+v", got, want)
	}
	out.Reset()
	if code := run([]string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if line := out.String(); !strings.HasPrefix(line, "waldenctl "+want.Version+" (commit ") || strings.Count(line, "\n") != 1 {
		t.Fatalf("version = %q", line)
	}
}
