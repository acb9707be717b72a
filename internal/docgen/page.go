package docgen

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// UpdateEnv, set to 1, makes Sync write the pages instead of comparing
// them (`make docs` sets it).
const UpdateEnv = "WALDEN_UPDATE_DOCS"

// ErrDrift means a generated page or region differs from what the code
// says; the error names the page and `make docs`.
var ErrDrift = errors.New("docgen: generated documentation is out of date")

// Markers of a generated region inside a hand-written page.
func begin(name string) string {
	return "<!-- BEGIN GENERATED " + name + " (make docs writes this part from the code: edit the doc comments there) -->"
}

func end(name string) string { return "<!-- END GENERATED " + name + " -->" }

// ReplaceRegion returns page with the generated region name replaced by
// body; the page must hold the region's markers.
func ReplaceRegion(page, name, body string) (string, error) {
	b, e := begin(name), end(name)
	i := strings.Index(page, b)
	j := strings.Index(page, e)
	if i < 0 || j < i {
		return "", fmt.Errorf("docgen: the page has no region %q (add the lines %q and %q)", name, b, e)
	}
	return page[:i+len(b)] + "\n" + strings.TrimRight(body, "\n") + "\n" + page[j:], nil
}

// Sync brings the file at path to what update makes of its content: with
// WALDEN_UPDATE_DOCS=1 it writes it, otherwise a difference is an ErrDrift
// that says to run make docs.
func Sync(path string, update func(old string) (string, error)) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	want, err := update(string(old))
	if err != nil {
		return err
	}
	if want == string(old) {
		return nil
	}
	if os.Getenv(UpdateEnv) == "1" {
		return os.WriteFile(path, []byte(want), 0o644)
	}
	return fmt.Errorf("%w: %s differs from what the code says (%s): run `make docs` and commit the result", ErrDrift, path, firstDiff(string(old), want))
}

// firstDiff names the first line that differs.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			if len(y) > 120 {
				y = y[:120] + "…"
			}
			return fmt.Sprintf("line %d should read %q", i+1, y)
		}
	}
	return "same lines"
}
