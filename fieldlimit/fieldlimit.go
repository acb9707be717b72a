package fieldlimit

import (
	"context"
	"fmt"

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
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return check(v.Message(), path)
	}
	return nil
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
