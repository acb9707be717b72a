package docgen

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
)

// ErrNoModule means the module root (the directory of go.mod) was not
// found above the working directory.
var ErrNoModule = errors.New("docgen: no go.mod above the working directory")

// Key is one configuration key: its dotted YAML path, its Go type, its
// default and the doc comment of its field.
type Key struct {
	Path    string
	Type    string
	Default string
	Doc     string
}

// ConfigKeys lists every YAML key of the struct def points to, depth first
// in field order, with the defaults def holds and the doc comments of the
// fields (read from the Go source of the module). Sections (structs) are
// listed before their keys; fields tagged yaml:"-" are skipped.
func ConfigKeys(def any) ([]Key, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	v := reflect.ValueOf(def)
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	var out []Key
	err = walk(root, "", v, &out)
	return out, err
}

func walk(root, prefix string, v reflect.Value, out *[]Key) error {
	t := v.Type()
	docs, err := fieldDocs(root, t)
	if err != nil {
		return err
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		fv := v.Field(i)
		if strings.Contains(opts, "inline") {
			if err := walk(root, prefix, fv, out); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := prefix + name
		doc := docs[f.Name]
		if rest, ok := strings.CutPrefix(doc, f.Name+" "); ok {
			doc = "`" + name + "` " + rest // the key as the file names it
		}
		k := Key{Path: path, Type: typeName(f.Type), Doc: doc}
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Duration(0)):
			k.Type = "section"
			*out = append(*out, k)
			if err := walk(root, path+".", fv, out); err != nil {
				return err
			}
			continue
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			k.Type = "section"
			*out = append(*out, k)
			elem := fv
			if elem.IsNil() {
				elem = reflect.New(ft.Elem())
			}
			if err := walk(root, path+".", elem.Elem(), out); err != nil {
				return err
			}
			continue
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			k.Type = "list"
			*out = append(*out, k)
			if err := walk(root, path+"[].", reflect.New(ft.Elem()).Elem(), out); err != nil {
				return err
			}
			continue
		}
		k.Default = defaultText(fv)
		*out = append(*out, k)
	}
	return nil
}

func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(time.Duration(0)):
		return "duration"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem())
	case t.Kind() == reflect.Map:
		return "map of " + typeName(t.Elem())
	case t.Kind() == reflect.Bool:
		return "bool"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "number"
	}
	return t.Kind().String()
}

// defaultText is a default value as YAML would say it; "" for a zero
// string, list or map (no default).
func defaultText(v reflect.Value) string {
	if d, ok := v.Interface().(time.Duration); ok {
		if d == 0 {
			return "0s"
		}
		return d.String()
	}
	switch v.Kind() {
	case reflect.String:
		return v.String()
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			return ""
		}
		var parts []string
		for i := range v.Len() {
			if v.Kind() == reflect.Slice {
				parts = append(parts, fmt.Sprint(v.Index(i).Interface()))
			}
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}

var (
	docsMu    sync.Mutex
	docsCache = map[reflect.Type]map[string]string{}
)

// fieldDocs reads the doc comments of struct type t's fields from the Go
// source of its package (inside the module at root).
func fieldDocs(root string, t reflect.Type) (map[string]string, error) {
	docsMu.Lock()
	defer docsMu.Unlock()
	if d, ok := docsCache[t]; ok {
		return d, nil
	}
	mod, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	rel, ok := strings.CutPrefix(t.PkgPath(), mod)
	if !ok {
		return nil, fmt.Errorf("docgen: %s is not a package of module %s", t.PkgPath(), mod)
	}
	dir := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
	// The package's own files first; its tests only for a type of theirs.
	out, found, err := structDocs(dir, t.Name(), func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") })
	if err == nil && !found {
		out, found, err = structDocs(dir, t.Name(), func(fi os.FileInfo) bool { return strings.HasSuffix(fi.Name(), "_test.go") })
	}
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("docgen: type %s not found in %s", t.Name(), dir)
	}
	docsCache[t] = out
	return out, nil
}

// structDocs reads the doc comments of the fields of struct type name in
// the files of dir that filter accepts.
func structDocs(dir, name string, filter func(os.FileInfo) bool) (map[string]string, bool, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, filter, parser.ParseComments)
	if err != nil {
		return nil, false, fmt.Errorf("docgen: parse %s: %w", dir, err)
	}
	out := map[string]string{}
	found := false
	for _, p := range pkgs {
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok || ts.Name.Name != name || found {
					return !found
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return false
				}
				found = true
				prev := ""
				for _, fl := range st.Fields.List {
					text := strings.Join(strings.Fields(fl.Doc.Text()+" "+fl.Comment.Text()), " ")
					for _, n := range fl.Names {
						// A comment may speak of two fields at once ("RetryMin
						// and RetryMax bound ..."): the second field has it too.
						if text == "" && strings.Contains(prev, n.Name) {
							text = prev
						}
						out[n.Name] = text
					}
					prev = text
				}
				return false
			})
		}
	}
	return out, found, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoModule
		}
		dir = parent
	}
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("docgen: no module line in %s/go.mod", root)
}

// ConfigTable is the Markdown table of keys: key, type, default, and the
// doc comment (which states the key's limits).
func ConfigTable(keys []Key) string {
	var b strings.Builder
	b.WriteString("| key | type | default | meaning and limits |\n|---|---|---|---|\n")
	for _, k := range keys {
		def := "–"
		if k.Type == "section" || k.Type == "list" {
			def = ""
		} else if k.Default != "" {
			def = "`" + k.Default + "`"
		}
		doc := k.Doc
		if doc == "" {
			doc = "(no doc comment)"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Path, k.Type, def, strings.ReplaceAll(doc, "|", "\\|"))
	}
	return b.String()
}

// Undocumented lists the keys whose field has no doc comment.
func Undocumented(keys []Key) []string {
	var out []string
	for _, k := range keys {
		if k.Doc == "" {
			out = append(out, k.Path)
		}
	}
	sort.Strings(out)
	return out
}
