package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"walden/typo"

	"go.yaml.in/yaml/v3"
)

// source remembers where each key of a configuration was written, so that
// validation errors can name the file and the line.
type source struct {
	file string
	// root is the line of the top-level mapping.
	root int
	// keys maps a dotted key ("listen.raft", "initial_cluster[0].id") to the
	// line it was written on. A key absent from the map was not written.
	keys map[string]int
}

// line returns the line of key, or, when key was not written, the line of
// the nearest enclosing key that was (the mapping that should hold it).
func (s *source) line(key string) int {
	if s == nil {
		return 0
	}
	for key != "" {
		if l, ok := s.keys[key]; ok {
			return l
		}
		key = parentKey(key)
	}
	return s.root
}

// has reports whether key was written in the file.
func (s *source) has(key string) bool {
	if s == nil {
		return false
	}
	_, ok := s.keys[key]
	return ok
}

func parentKey(key string) string {
	i := strings.LastIndexAny(key, ".[")
	if i < 0 {
		return ""
	}
	return key[:i]
}

// errAt builds the *Error for key as written in s (s may be nil).
func (s *source) errAt(key, format string, args ...any) *Error {
	e := &Error{Key: key, Reason: fmt.Sprintf(format, args...)}
	if s != nil {
		e.File = s.file
		e.Line = s.line(key)
	}
	return e
}

var yamlLineRE = regexp.MustCompile(`^yaml: (?:line (\d+): )?`)

// MaxFileBytes bounds a configuration file: a larger one is refused before
// it is read (a configuration is a few kilobytes; /dev/zero is endless).
const MaxFileBytes = 1 << 20

// MaxDuration bounds every duration of a configuration, so that no sum of
// a few of them (failure_timeout + restart_grace + drift_margin...) can
// overflow: 30 days.
const MaxDuration = 30 * 24 * time.Hour

// decodeFile reads path and decodes it strictly into out, a pointer to a
// struct whose fields carry `yaml:"name"` tags. Values already in out are
// defaults that the file overrides. Only a regular file of at most
// MaxFileBytes is read: a FIFO, a device or a directory is refused without
// blocking on it.
func decodeFile(path string, out any) (*source, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	return decodeBytes(path, data, out)
}

func readConfigFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{File: path, Reason: fmt.Sprintf("not a regular file (%s): a configuration is read from a regular file", fileKind(st.Mode()))}
	}
	if st.Size() > MaxFileBytes {
		return nil, &Error{File: path, Reason: fmt.Sprintf("%d bytes is larger than a configuration may be (%d bytes)", st.Size(), MaxFileBytes)}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	if st2, err := f.Stat(); err != nil || !os.SameFile(st, st2) {
		return nil, &Error{File: path, Reason: "the file changed while it was opened"}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, &Error{File: path, Reason: fmt.Sprintf("larger than a configuration may be (%d bytes)", MaxFileBytes)}
	}
	return data, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

func decodeBytes(file string, data []byte, out any) (*source, error) {
	src := &source{file: file, root: 1, keys: map[string]int{}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		// yaml's messages read "yaml: line N: reason"; move N to the front.
		msg := err.Error()
		line := 0
		if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
			if m[1] != "" {
				line, _ = strconv.Atoi(m[1])
			}
			msg = "invalid YAML: " + strings.TrimPrefix(msg, m[0])
		}
		if strings.Contains(msg, "tab character") {
			// yaml names the line of the enclosing construct; point at the
			// first line indented with a tab instead.
			for i, l := range strings.Split(string(data), "\n") {
				if indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]; strings.Contains(indent, "\t") {
					line = i + 1
					break
				}
			}
		}
		return nil, &Error{File: file, Line: line, Reason: msg}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &Error{File: file, Line: 1, Reason: "file is empty"}
	}
	root := doc.Content[0]
	src.root = root.Line
	d := decoder{src: src}
	if err := d.decode(root, reflect.ValueOf(out).Elem(), ""); err != nil {
		return nil, err
	}
	// A second document ("---") is refused, not ignored: whoever wrote it
	// expected it to count.
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &Error{File: file, Reason: "more than one YAML document, and the second is not valid YAML: a configuration is one document"}
	default:
		return nil, &Error{File: file, Line: max(next.Line, 1), Reason: "more than one YAML document (a second \"---\"): a configuration is one document"}
	}
	return src, nil
}

type decoder struct{ src *source }

var durationType = reflect.TypeOf(time.Duration(0))

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!null":
			return "an empty value"
		}
		return "the value " + n.Value
	}
	return "an unsupported YAML node"
}

func (d *decoder) fail(n *yaml.Node, key, format string, args ...any) *Error {
	return &Error{File: d.src.file, Line: n.Line, Key: key, Reason: fmt.Sprintf(format, args...)}
}

func joinKey(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// decode stores n into v. key is n's dotted key ("" for the root).
func (d *decoder) decode(n *yaml.Node, v reflect.Value, key string) error {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if v.Type() == durationType {
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			return d.fail(n, key, "expected a duration such as \"100ms\" or \"5s\", got %s", describe(n))
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			return d.fail(n, key, "invalid duration %q (use Go syntax such as \"100ms\" or \"5s\")", n.Value)
		}
		if dur > MaxDuration || dur < -MaxDuration {
			return d.fail(n, key, "duration %s is longer than any walden accepts (%s)", n.Value, MaxDuration)
		}
		v.SetInt(int64(dur))
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer:
		// An optional value: nil when the key is absent.
		p := reflect.New(v.Type().Elem())
		if err := d.decode(n, p.Elem(), key); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Struct:
		return d.decodeStruct(n, v, key)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.fail(n, key, "expected a list, got %s", describe(n))
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			ik := fmt.Sprintf("%s[%d]", key, i)
			d.src.keys[ik] = item.Line
			if err := d.decode(item, s.Index(i), ik); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			return d.fail(n, key, "expected a string, got %s", describe(n))
		}
		v.SetString(n.Value)
		return nil
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			return d.fail(n, key, "expected true or false, got %s", describe(n))
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			return d.fail(n, key, "expected true or false, got %s", describe(n))
		}
		v.SetBool(b)
		return nil
	case reflect.Int, reflect.Int32, reflect.Int64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			return d.fail(n, key, "expected an integer, got %s", describe(n))
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, v.Type().Bits())
		if err != nil || (v.Kind() == reflect.Int && (i > math.MaxInt32 || i < math.MinInt32)) {
			return d.fail(n, key, "integer %s out of range", n.Value)
		}
		v.SetInt(i)
		return nil
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!float" && n.ShortTag() != "!!int") {
			return d.fail(n, key, "expected a number, got %s", describe(n))
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil {
			return d.fail(n, key, "invalid number %s", n.Value)
		}
		v.SetFloat(f)
		return nil
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			return d.fail(n, key, "expected a non-negative integer, got %s", describe(n))
		}
		if strings.HasPrefix(n.Value, "-") {
			return d.fail(n, key, "must not be negative, got %s", n.Value)
		}
		u, err := strconv.ParseUint(strings.ReplaceAll(strings.TrimPrefix(n.Value, "+"), "_", ""), 0, v.Type().Bits())
		if err != nil {
			return d.fail(n, key, "integer %s out of range", n.Value)
		}
		v.SetUint(u)
		return nil
	}
	return d.fail(n, key, "internal: unsupported field type %s", v.Type())
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, key string) error {
	if n.Kind != yaml.MappingNode {
		return d.fail(n, key, "expected a mapping, got %s", describe(n))
	}
	fields := map[string]int{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = i
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.fail(k, key, "keys must be plain names, got %s", describe(k))
		}
		full := joinKey(key, k.Value)
		if k.Value == "<<" {
			return d.fail(k, full, "merge keys are not supported")
		}
		if _, dup := d.src.keys[full]; dup {
			return d.fail(k, full, "duplicate key (first set on line %d)", d.src.keys[full])
		}
		fi, ok := fields[k.Value]
		if !ok {
			return d.fail(k, full, "unknown key%s", suggest(k.Value, fields))
		}
		d.src.keys[full] = k.Line
		if err := d.decode(val, v.Field(fi), full); err != nil {
			return err
		}
	}
	return nil
}

// suggest names the known key closest to an unknown one (at most two
// edits away; of keys equally near, the first in order), or else every
// known key.
func suggest(name string, fields map[string]int) string {
	keys := slices.Sorted(maps.Keys(fields))
	if best := typo.Closest(name, keys, 2); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return " (known keys: " + strings.Join(keys, ", ") + ")"
}
