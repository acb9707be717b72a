package server

import (
	"context"
	"io"
	"log/slog"
	"slices"

	"walden/config"
)

// NewLogger returns the process logger described by c (level and json or
// text format), writing to w. Every line has each key once (see
// uniqueKeys).
func NewLogger(c config.Log, w io.Writer) *slog.Logger {
	return NewLevelLogger(c, w, new(slog.LevelVar))
}

// NewLevelLogger is NewLogger with the level held in level: set it from c
// now, and later (SIGHUP) to change the level of the running process.
func NewLevelLogger(c config.Log, w io.Writer, level *slog.LevelVar) *slog.Logger {
	level.Set(ParseLevel(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if c.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	} else {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(&uniqueKeys{next: h})
}

// ParseLevel turns log.level (debug, info, warn, error; validated by the
// config) into a slog level; anything else is info.
func ParseLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// uniqueKeys is a slog.Handler that writes every key of a line once: an
// attribute added later (a logger's With, then the call's own arguments)
// replaces one of the same key added before, at the same group level, in
// the position of the first. slog's JSON and text handlers write every
// attribute they are given, so a component that adds node_id or component
// to a logger that already has them would otherwise produce lines with
// repeated keys, which log stores reject or mangle.
type uniqueKeys struct {
	next  slog.Handler // with the attributes of the enclosing groups only
	attrs []slog.Attr  // of the innermost group, unique keys
}

func (h *uniqueKeys) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *uniqueKeys) WithAttrs(as []slog.Attr) slog.Handler {
	return &uniqueKeys{next: h.next, attrs: mergeAttrs(slices.Clone(h.attrs), as)}
}

func (h *uniqueKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	// The attributes so far belong to the enclosing level: hand them down.
	return &uniqueKeys{next: h.next.WithAttrs(h.attrs).WithGroup(name)}
}

func (h *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	attrs := slices.Clone(h.attrs)
	var own []slog.Attr
	r.Attrs(func(a slog.Attr) bool {
		own = append(own, a)
		return true
	})
	attrs = mergeAttrs(attrs, own)
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(attrs...)
	return h.next.Handle(ctx, out)
}

// mergeAttrs adds as to dst: a key already present is replaced in place,
// a new one appended. Empty attributes are dropped, as slog does; the
// attributes of an inline group (empty key) are merged one by one.
func mergeAttrs(dst, as []slog.Attr) []slog.Attr {
	for _, a := range as {
		if a.Equal(slog.Attr{}) {
			continue
		}
		if a.Key == "" && a.Value.Kind() == slog.KindGroup {
			dst = mergeAttrs(dst, a.Value.Group())
			continue
		}
		if i := slices.IndexFunc(dst, func(b slog.Attr) bool { return b.Key == a.Key }); i >= 0 {
			dst[i] = a
		} else {
			dst = append(dst, a)
		}
	}
	return dst
}
