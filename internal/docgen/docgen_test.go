package docgen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sample is a config struct of this package's test: a section, a list of
// sections, a key without a comment and a key the comment of the one
// before it names.
type sample struct {
	// Name is the name. Required.
	Name string `yaml:"name"`
	// Timeout bounds the wait. Default 5s; at most 1m.
	Timeout time.Duration `yaml:"timeout"`
	// Inner is a section.
	Inner inner `yaml:"inner"`
	// Items are listed.
	Items []inner `yaml:"items"`
	// Min and Max bound it.
	Min, Max int
	Bare     bool   `yaml:"bare"`
	Hidden   string `yaml:"-"`
}

type inner struct {
	// Port is a port.
	Port int `yaml:"port"`
}

func TestConfigKeys(t *testing.T) {
	keys, err := ConfigKeys(&sample{Timeout: 5 * time.Second, Inner: inner{Port: 7}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, k.Path+"|"+k.Type+"|"+k.Default+"|"+k.Doc)
	}
	want := []string{
		"name|string||`name` is the name. Required.",
		"timeout|duration|5s|`timeout` bounds the wait. Default 5s; at most 1m.",
		"inner|section||`inner` is a section.",
		"inner.port|integer|7|`port` is a port.",
		"items|list||`items` are listed.",
		"items[].port|integer|0|`port` is a port.",
		"min|integer|0|`min` and Max bound it.",
		"max|integer|0|Min and Max bound it.",
		"bare|bool|false|",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("keys:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if u := Undocumented(keys); len(u) != 1 || u[0] != "bare" {
		t.Fatalf("undocumented %v", u)
	}
}

func TestSyncSaysToRunMakeDocs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "page.md")
	page := "# page\n\n" + begin("x") + "\nold\n" + end("x") + "\n\ntail\n"
	if err := os.WriteFile(p, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	update := func(old string) (string, error) { return ReplaceRegion(old, "x", "new") }
	err := Sync(p, update)
	if !errors.Is(err, ErrDrift) || !strings.Contains(err.Error(), "run `make docs`") || !strings.Contains(err.Error(), `line 4 should read "new"`) {
		t.Fatalf("drift: %v", err)
	}
	t.Setenv(UpdateEnv, "1")
	if err := Sync(p, update); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if want := "# page\n\n" + begin("x") + "\nnew\n" + end("x") + "\n\ntail\n"; string(b) != want {
		t.Fatalf("written %q", b)
	}
	if _, err := ReplaceRegion("no markers", "x", "y"); err == nil {
		t.Fatal("a page without the region's markers was accepted")
	}
}
