package fieldlimit

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The limits. Identifiers are checked tighter by the handlers (names of
// at most 63 characters); these bound everything else.
const (
	// MaxString bounds a string field: ids, names, addresses, reasons,
	// S3 keys, policy values.
	MaxString = 1024
	// MaxPath bounds a field named "path" (a WAL file or device).
	MaxPath = 4096
	// MaxRepeated bounds the elements of a repeated field (an object's
	// ranges, a list of members).
	MaxRepeated = 10_000
	// MaxMapEntries bounds the entries of a map field (policy keys).
	MaxMapEntries = 1_000
)

// MaxDuration bounds every duration of a request (a field counted in
// milliseconds: a name ending in _ms, but not the times, _unix_ms): 30
// days, the bound of the configuration's durations. A handler bounds its
// own fields tighter with Millis.
const MaxDuration = 30 * 24 * time.Hour

// stringLimits are the limits of string fields by name, where they differ
// from MaxString.
var stringLimits = map[protoreflect.Name]int{"path": MaxPath}

// Violation names the first field of a message over its limit.
type Violation struct {
	// Field is the field's path: "wal.path", "object.ranges[3]".
	Field string
	// Reason says by how much, for people.
	Reason string
}

func (v *Violation) Error() string { return v.Field + ": " + v.Reason }

// Check returns the first field of m over its limit as a *Violation, or
// nil.
func Check(m proto.Message) error {
	if m == nil {
		return nil
	}
	if v := check(m.ProtoReflect(), ""); v != nil {
		return v
	}
	return nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func check(m protoreflect.Message, prefix string) *Violation {
	var out *Violation
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := join(prefix, string(fd.Name()))
		switch {
		case fd.IsMap():
			mp := v.Map()
			if mp.Len() > MaxMapEntries {
				out = &Violation{path, fmt.Sprintf("%d entries is more than the %d allowed", mp.Len(), MaxMapEntries)}
				return false
			}
			mp.Range(func(k protoreflect.MapKey, val protoreflect.Value) bool {
				kp := fmt.Sprintf("%s[%v]", path, shorten(k.String()))
				if fd.MapKey().Kind() == protoreflect.StringKind {
					if out = checkString(kp+" (key)", fd.MapKey(), k.String()); out != nil {
						return false
					}
				}
				out = checkValue(kp, fd.MapValue(), val)
				return out == nil
			})
		case fd.IsList():
			l := v.List()
			if l.Len() > MaxRepeated {
				out = &Violation{path, fmt.Sprintf("%d elements is more than the %d allowed", l.Len(), MaxRepeated)}
				return false
			}
			for i := 0; i < l.Len() && out == nil; i++ {
				out = checkValue(fmt.Sprintf("%s[%d]", path, i), fd, l.Get(i))
			}
		default:
			out = checkValue(path, fd, v)
		}
		return out == nil
	})
	return out
}

func checkValue(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) *Violation {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return checkString(path, fd, v.String())
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind,
		protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
		if isDuration(fd) {
			return checkDuration(path, v.Int())
		}
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		if isDuration(fd) {
			return checkDuration(path, clampInt64(v.Uint()))
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return check(v.Message(), path)
	}
	return nil
}

// isDuration reports whether fd holds a duration in milliseconds (and not
// a time: those end in _unix_ms).
func isDuration(fd protoreflect.FieldDescriptor) bool {
	n := string(fd.Name())
	return strings.HasSuffix(n, "_ms") && !strings.HasSuffix(n, "_unix_ms")
}

func clampInt64(u uint64) int64 {
	if u > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(u)
}

// checkDuration refuses a duration of a request that no handler accepts:
// negative, or longer than MaxDuration.
func checkDuration(path string, ms int64) *Violation {
	if ms < 0 {
		return &Violation{path, fmt.Sprintf("%s is negative: a duration is at least 0", msText(ms))}
	}
	if _, err := Millis(path, ms, 0, MaxDuration); err != nil {
		return &Violation{path, fmt.Sprintf("%s is longer than any duration walden accepts (%s)", msText(ms), MaxDuration)}
	}
	return nil
}

// Millis returns the duration of field, ms milliseconds, or a *Violation
// naming field when it is below lo or above hi. It compares the
// milliseconds before it multiplies: time.Duration(ms) * time.Millisecond
// wraps for ms beyond 2^63/10^6 (SetMaintenance with ttl_ms 2^63-1 once
// passed a 168 h bound that way and lasted 1.5 s). Every duration of a
// request goes through it before any arithmetic.
func Millis(field string, ms int64, lo, hi time.Duration) (time.Duration, error) {
	switch {
	case ms < lo.Milliseconds():
		return 0, &Violation{field, fmt.Sprintf("%s is less than the %s allowed", msText(ms), lo)}
	case ms > hi.Milliseconds():
		return 0, &Violation{field, fmt.Sprintf("%s is more than the %s allowed", msText(ms), hi)}
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// msText writes ms for a refusal, with its Go form when it has one.
func msText(ms int64) string {
	if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return fmt.Sprintf("%d ms", ms)
	}
	return fmt.Sprintf("%d ms (%s)", ms, time.Duration(ms)*time.Millisecond)
}

// Count returns the count n of field as an int, or a *Violation naming
// field when it is above hi: every count of a request (a limit, a
// maximum of records or objects) goes through it before it sizes
// anything.
func Count(field string, n uint64, hi int) (int, error) {
	if hi < 0 || n > uint64(hi) {
		return 0, &Violation{field, fmt.Sprintf("%d is more than the %d allowed", n, hi)}
	}
	return int(n), nil
}

func checkString(path string, fd protoreflect.FieldDescriptor, s string) *Violation {
	limit, ok := stringLimits[fd.Name()]
	if !ok {
		limit = MaxString
	}
	if len(s) > limit {
		return &Violation{path, fmt.Sprintf("%d bytes is longer than the %d allowed", len(s), limit)}
	}
	return nil
}

func shorten(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q...", s[:40])
	}
	return fmt.Sprintf("%q", s)
}

// invalid is the InvalidArgument status naming the field.
func invalid(err error) error {
	v, ok := err.(*Violation)
	if !ok {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	s := status.New(codes.InvalidArgument, v.Error())
	if d, derr := s.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: v.Field, Description: v.Reason},
	}}); derr == nil {
		s = d
	}
	return s.Err()
}

// UnaryInterceptor refuses a request with a field over its limit.
func UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok {
			if err := Check(m); err != nil {
				return nil, invalid(err)
			}
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor refuses every received message with a field over its
// limit (the stream ends with InvalidArgument).
func StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &limitedStream{ss})
	}
}

type limitedStream struct{ grpc.ServerStream }

func (s *limitedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		if err := Check(pm); err != nil {
			return invalid(err)
		}
	}
	return nil
}
