package config

import (
	"errors"
	"fmt"
)

// ErrInvalid is matched (errors.Is) by every *Error: the configuration file
// could not be read as YAML, has an unknown key, a value of the wrong type, a
// missing required key or a value that is not allowed.
var ErrInvalid = errors.New("config: invalid configuration")

// Error is one mistake in a configuration. Its text is
// "FILE:LINE: KEY: reason"; FILE and LINE are left out when the configuration
// was not read from a file, KEY when the mistake is not about one key (a YAML
// syntax error).
type Error struct {
	// File is the configuration file's path as given.
	File string
	// Line is the 1-based line of the key; for a missing key, the line of
	// the mapping that should hold it. 0 when unknown.
	Line int
	// Key is the dotted key, e.g. "listen.raft" or "initial_cluster[1].id".
	Key string
	// Reason says what is wrong.
	Reason string
}

func (e *Error) Error() string {
	s := ""
	if e.File != "" {
		s = e.File + ":"
		if e.Line > 0 {
			s += fmt.Sprintf("%d:", e.Line)
		}
		s += " "
	}
	if e.Key != "" {
		s += e.Key + ": "
	}
	return s + e.Reason
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }
